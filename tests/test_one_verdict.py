# SPDX-License-Identifier: Apache-2.0
"""One verdict per host, in every command that decides about cards (issue 31, point 1):
what scan warns about a card, plan, apply and kubevirt preflight tell too, and what makes a
card unsafe for a guest (an ACS override) withholds the node label in both kubevirt paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from passthrough.analysis import codes
from tests.cli_process import run_cli

ACS = "acs-override-proxmox"


def test_kubevirt_preflight_warns_an_acs_override_as_check_does_and_withholds_the_label(
    hosts: dict[str, Path],
) -> None:
    text = run_cli(["kubevirt", "preflight", "--root", str(hosts[ACS])])
    assert text.returncode == 1, text.stdout
    assert "WARN  acs-override" in text.stdout  # check's level for the same finding
    assert "FAIL  kube-mode-label" in text.stdout
    assert "holds only the card" not in text.stdout
    assert "label the node" not in text.stdout
    out = run_cli(["kubevirt", "preflight", "--root", str(hosts[ACS]), "--json"])
    report = json.loads(out.stdout)
    assert report["ok"] is False
    assert report["labels"] == {}
    assert any(c["id"] == "acs-override" and c["level"] == "WARN" for c in report["checks"])


def test_kubevirt_preflight_tells_the_cards_warnings(hosts: dict[str, Path]) -> None:
    """The NVSwitch warning scan gives each HGX card is a WARN check here too."""
    out = run_cli(["kubevirt", "preflight", "--root", str(hosts["hgx-h100"]), "--json"])
    warned = [c for c in json.loads(out.stdout)["checks"] if c["level"] == "WARN"]
    assert warned and {c["id"] for c in warned} == {"nvswitch"}


def test_kubevirt_render_withholds_the_label_over_an_acs_override(hosts: dict[str, Path]) -> None:
    out = run_cli(["kubevirt", "render", "--name", "g", "--root", str(hosts[ACS]), "--json"])
    assert out.returncode == 0, out.stderr
    manifests = json.loads(out.stdout)
    assert manifests["node_labels"] == {}
    assert any("withheld" in w and "acs-override" in w for w in manifests["warnings"])
    text = run_cli(["kubevirt", "render", "--name", "g", "--root", str(hosts[ACS])])
    assert "node label:" not in text.stdout


def test_only_acs_override_is_unsafe_among_the_warnings() -> None:
    """The table says which warnings make a card unsafe; a refusal always does."""
    unsafe = {c for c, p in codes.POLICY.items() if p.unsafe}
    assert unsafe == {codes.ACS_OVERRIDE}
    assert all(p.severity == "warning" for c, p in codes.POLICY.items() if c in unsafe)


def test_plan_json_notes_the_optimus_cards_warning(hosts: dict[str, Path]) -> None:
    out = run_cli(["plan", "--root", str(hosts["optimus-laptop"]), "--json"])
    notes = json.loads(out.stdout)["notes"]
    assert any(n.endswith("[laptop-3d]") for n in notes), notes


def test_plan_and_apply_tell_the_acs_override(hosts: dict[str, Path], tmp_path: Path) -> None:
    plan = run_cli(["plan", "--root", str(hosts[ACS])])
    assert "note: 0000:24:00.0: pcie_acs_override=" in plan.stdout
    root = tmp_path / "root"
    shutil.copytree(hosts[ACS], root, symlinks=True)
    applied = run_cli(["apply", "--root", str(root), "--json"])
    assert applied.returncode == 0, applied.stderr
    assert [w.split(" [")[-1] for w in json.loads(applied.stdout)["warnings"]] == ["acs-override]"]
    shutil.rmtree(root)
    shutil.copytree(hosts[ACS], root, symlinks=True)
    text = run_cli(["apply", "--root", str(root)])
    assert "warning: 0000:24:00.0: pcie_acs_override=" in text.stderr
