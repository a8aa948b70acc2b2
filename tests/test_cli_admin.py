"""The CLI on a host an admin runs it on (issue 22 item 5): plan and apply tell the same
story, an IOMMU-only plan, earlier cards kept, verify on any host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from passthrough.cli import main

from .conftest import bind_to_vfio


@pytest.fixture
def host(hosts: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of consumer-intel (Debian 12, GRUB, initramfs-tools): not a full OS tree,
    so apply lists its commands instead of running them."""
    root = tmp_path / "host"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    return root


def test_plan_and_apply_name_the_same_pending_commands(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["apply", "--root", str(host), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["commands_not_run"]
    assert listed, "a sample root lists its commands"
    assert main(["apply", "--root", str(host), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["changed"] is False and again["pending"] == listed
    assert main(["plan", "--root", str(host), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["actions"] == [] and plan["pending"] == listed
    assert main(["plan", "--root", str(host)]) == 0
    text = capsys.readouterr().out
    assert "Nothing to do" in text and "Still pending from an earlier apply" in text
    assert "update-initramfs -u -k all" in text


def test_verify_on_a_host_prepared_by_hand(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # acs-override-proxmox: its GPU was put on vfio-pci by hand (no journal of ours)
    assert main(["verify", "--root", str(hosts["acs-override-proxmox"]), "--json"]) == 0
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["origin"]["level"] == "SKIP"
    assert "prepared by hand or by another tool" in checks["origin"]["summary"]
    bound = [i for i, c in checks.items() if i.startswith("vfio ") and c["level"] == "PASS"]
    assert bound, checks
    assert checks["host-devices"]["level"] == "PASS"


def test_verify_names_what_did_not_come_from_us(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["apply", "--root", str(host)]) == 0
    capsys.readouterr()
    # after the reboot: the card on vfio-pci, and a USB controller the admin bound by hand
    for fn in ("0000:01:00.0", "0000:01:00.1", "0000:00:14.0"):
        bind_to_vfio(host, fn)
    main(["verify", "--root", str(host), "--json"])
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["vfio 0000:01:00.0"]["summary"] == "10de:2684 bound to vfio-pci"
    assert checks["vfio 0000:00:14.0"]["summary"].endswith("bound to vfio-pci (not by passthrough)")
    assert "origin" not in checks
