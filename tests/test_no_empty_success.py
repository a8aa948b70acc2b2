# SPDX-License-Identifier: Apache-2.0
"""No empty success (issue 31, point 2): render refuses a host with no card to pass through
unless a guest without one is asked for; a guest with nothing to boot is warned about by
render and ``vm define``; ``vm define`` refuses a domain whose disk file does not exist.
``vm define`` runs against libvirt's real test driver (test:///default)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_process import run_cli

NO_CARD = ["bmc-only-server", "epyc-v100", "iommu-off", "two-gpus-one-group", "intel-arc-a770"]
GPU = ["--gpu", "0000:18:00.0"]  # one H100 of hgx-h100


@pytest.mark.parametrize("name", NO_CARD)
def test_render_refuses_a_host_with_no_card(
    name: str, hosts: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "vm.xml"
    got = run_cli(["render", "--name", "g", "--root", str(hosts[name]), "-o", str(out)])
    assert got.returncode == 2, got.stdout
    errors = [line for line in got.stderr.splitlines() if line.startswith("passthrough: error:")]
    assert len(errors) == 1 and "--no-gpu" in errors[0], got.stderr
    assert not out.exists() and got.stdout == ""


@pytest.mark.parametrize("name", ["iommu-off", "hgx-h100", "turing-desktop"])
def test_no_gpu_renders_a_guest_without_a_card_by_flag_and_spec_key(
    name: str, hosts: dict[str, Path], tmp_path: Path
) -> None:
    """Without a card, on a host with none to give and on hosts with eight and one viable
    (where --no-gpu rendered every viable card before: `vm define --start` would have taken
    them all off the host)."""
    root = str(hosts[name])
    out = tmp_path / "vm.xml"
    got = run_cli(["render", "--name", "g", "--root", root, "--no-gpu", "-o", str(out)])
    assert got.returncode == 0, got.stderr
    assert "(g: 0 hostdevs)" in got.stdout and "<hostdev" not in out.read_text()
    spec = tmp_path / "vm.yaml"
    spec.write_text("name: g\nno_gpu: true\n")
    by_spec = run_cli(["render", "--spec", str(spec), "--root", root])
    assert by_spec.returncode == 0 and "<hostdev" not in by_spec.stdout, by_spec.stderr
    both = run_cli(["render", "--name", "g", "--root", root, "--no-gpu", "--gpu", "01:00.0"])
    assert both.returncode == 2 and "no_gpu:" in both.stderr


def test_render_warns_of_nothing_to_boot_and_counts_one_hostdev(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = str(hosts["hgx-h100"])
    out = tmp_path / "vm.xml"
    bare = run_cli(["render", "--name", "g", "--root", root, *GPU, "-o", str(out)])
    assert "(g: 1 hostdev)" in bare.stdout
    assert "warning: nothing to boot:" in bare.stderr
    disk = tmp_path / "disk.qcow2"
    disk.write_bytes(b"")
    booted = run_cli(["render", "--name", "g", "--root", root, *GPU, "--disk", str(disk)])
    assert booted.returncode == 0 and "nothing to boot" not in booted.stderr


def test_vm_define_warns_of_nothing_to_boot(hosts: dict[str, Path], tmp_path: Path) -> None:
    xml = tmp_path / "vm.xml"
    run_cli(["render", "--name", "g", "--root", str(hosts["hgx-h100"]), *GPU, "-o", str(xml)])
    got = run_cli(["vm", "define", str(xml), "--connect", "test:///default", "--json"])
    assert got.returncode == 0, got.stderr
    assert "nothing to boot" in got.stderr
    assert any("nothing to boot" in w for w in json.loads(got.stdout)["warnings"])


def test_vm_define_refuses_a_disk_that_does_not_exist(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """A domain rendered with --base-image, defined without it: its overlay was never made."""
    base = tmp_path / "base.qcow2"
    base.write_bytes(b"")
    xml = tmp_path / "vm.xml"
    images = tmp_path / "images"
    render = ["render", "--name", "g", "--root", str(hosts["hgx-h100"]), *GPU]
    render += ["--base-image", str(base), "--image-dir", str(images), "-o", str(xml)]
    assert run_cli(render).returncode == 0
    got = run_cli(["vm", "define", str(xml), "--connect", "test:///default"])
    assert got.returncode == 2
    assert f"disk {images}/g.qcow2 does not exist" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


def test_kubevirt_render_refuses_no_gpu(hosts: dict[str, Path]) -> None:
    """The cluster path is for a GPU's guest: a VM without one is refused, not written."""
    spec = hosts["hgx-h100"].parent / "no-gpu.yaml"
    spec.write_text("no_gpu: true\n")  # kubevirt render has no --no-gpu flag: a spec says it
    args = ["kubevirt", "render", "--name", "g", "--root", str(hosts["hgx-h100"])]
    got = run_cli([*args, "--spec", str(spec)])
    assert got.returncode == 2 and got.stdout == ""
    assert "no_gpu: kubevirt renders a VM for GPUs" in got.stderr
