"""The lab: a real Debian 12 kernel under QEMU with an emulated Intel IOMMU (TCG), the
toolkit run inside it over SSH. See lab/run.py for the stages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.lab


def _run_lab(tmp_path: Path, *flags: str) -> dict[str, Any]:
    assert os.geteuid() == 0, "the lab image is built with debootstrap: run as root (CI does)"
    tools = ["qemu-system-x86_64", "debootstrap", "mkfs.ext4", "ssh", "ssh-keygen"]
    if "--full" in flags:
        tools += ["grub-mkstandalone", "mkfs.vfat", "mcopy", "sfdisk"]
    for tool in tools:
        assert shutil.which(tool), f"{tool} is required (scripts/setup.sh test installs it)"
    artifacts = Path(os.environ.get("PASSTHROUGH_LAB_ARTIFACTS", REPO / "lab-artifacts"))
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "lab/run.py"),
            *flags,
            "--json",
            "--artifacts",
            str(artifacts),
            "--keep",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result: dict[str, Any] = json.loads(r.stdout)
    assert result["ok"]
    return result


def test_lab_on_a_real_kernel(tmp_path: Path) -> None:
    result = _run_lab(tmp_path)
    assert result["groups"] >= 5
    assert (
        result["drivers"]["0000:01:00.0"] == "vfio-pci"
        and result["drivers"]["0000:01:00.1"] == "vfio-pci"
    )
    assert (
        result["drivers"]["0000:02:01.0"] != "vfio-pci"
    )  # the refused stand-in stayed with its driver
    assert set(result["timings"]) == {"image", "boot", "scan", "bind"}


def test_full_chain_through_a_real_reboot(tmp_path: Path) -> None:
    """UEFI + GRUB from the disk; apply runs the real update-initramfs and update-grub inside;
    the reboot brings the card up on vfio-pci; undo and another reboot bring it back."""
    result = _run_lab(tmp_path, "--full")
    assert all(d != "vfio-pci" for d in result["drivers_after_undo"].values())
    assert list(result["timings"]) == [
        "image",
        "boot (UEFI, GRUB from disk)",
        "apply (real update-initramfs, update-grub)",
        "reboot",
        "verify",
        "undo",
        "reboot after undo",
        "back to the original",
    ]
