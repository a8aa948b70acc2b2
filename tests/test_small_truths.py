# SPDX-License-Identifier: Apache-2.0
"""The small untruths of issue 31 (point 8): each command says what it does, or refuses."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.cli_process import run_cli

from .conftest import bind_to_vfio

REPO = Path(__file__).parents[1]


def test_snapshot_to_dash_refuses_and_writes_no_file_named_dash(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    got = run_cli(["snapshot", "--root", str(hosts["turing-desktop"]), "-o", "-"], cwd=tmp_path)
    assert got.returncode == 2
    assert "-o -: snapshot writes an archive file" in got.stderr
    assert list(tmp_path.iterdir()) == []


def test_validate_host_root_errors_name_host_root(tmp_path: Path) -> None:
    xml = tmp_path / "vm.xml"
    xml.write_text("<domain type='kvm'><name>x</name></domain>")
    for root in (tmp_path / "missing", xml):
        got = run_cli(["validate", "--host-root", str(root), str(xml)])
        assert got.returncode == 2
        assert got.stderr.startswith(f"passthrough: error: --host-root {root}:"), got.stderr


def test_completion_has_no_json_flag() -> None:
    """A completion script is shell text: --json is not offered, and given it is a usage error."""
    got = run_cli(["completion", "bash", "--json"])
    assert got.returncode == 2 and got.stdout == ""
    assert "unrecognized arguments: --json" in got.stderr
    assert "  --json" not in run_cli(["completion", "--help"]).stdout  # no such option line


def test_the_demo_uses_the_current_option_names() -> None:
    """validate's --libvirt is the older spelling of --connect: the demo teaches the new one."""
    demo = (REPO / "scripts/setup.sh").read_text()
    calls = [line for line in demo.splitlines() if "$pt validate" in line]
    assert calls and all("--connect" in c and "--libvirt" not in c for c in calls)


def test_the_kubevirt_header_promises_the_patch_it_emits(hosts: dict[str, Path]) -> None:
    root = str(hosts["hgx-h100"])
    args = ["kubevirt", "render", "--name", "g", "--root", root, "--gpu", "0000:18:00.0"]
    # the header promises a patch exactly where one is emitted: on the DRA route with nothing
    # by name it holds the feature gates alone (since the gates are in the patch itself)
    dra = run_cli([*args, "--route", "dra"]).stdout
    assert "kind: KubeVirt" in dra and "merge the KubeVirt patch" in dra.splitlines()[0]
    assert "featureGates:\n      - GPUsWithDRA\n" in dra and "permittedHostDevices" not in dra
    plugin = run_cli(args).stdout
    assert "kind: KubeVirt" in plugin and "merge the KubeVirt patch" in plugin.splitlines()[0]


def test_kubevirt_validate_counts_agree_in_number(tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
    got = run_cli(["kubevirt", "validate", str(one)])
    assert got.stdout.strip().endswith("1 object, 0 findings: ok"), got.stdout


def test_the_softdep_comment_names_every_card_its_driver_holds(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(hosts["hgx-h100"], root, symlinks=True)
    plan = run_cli(["plan", "--root", str(root)]).stdout
    (comment,) = re.findall(r"^\+# nvidia: .*$", plan, re.M)
    assert comment.count("0000:") == 8, comment
    # applied, a second plan keeps the line as it is: nothing left to change
    assert run_cli(["apply", "--root", str(root)]).returncode == 0
    again = run_cli(["plan", "--root", str(root)]).stdout
    assert "Nothing to do: the host already matches the plan." in again


def test_kubevirt_preflight_counts_one_function_in_the_singular(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """An H100 is one function: '1 function on vfio-pci', not 'all 1 functions'."""
    root = tmp_path / "root"
    shutil.copytree(hosts["hgx-h100"], root, symlinks=True)
    bind_to_vfio(root, "0000:18:00.0")  # what the reboot does (a stand-in, see conftest)
    got = run_cli(["kubevirt", "preflight", "--root", str(root), "--gpu", "18:00.0"])
    assert "0000:18:00.0: 1 function on vfio-pci" in got.stdout, got.stdout
