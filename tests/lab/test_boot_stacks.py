# SPDX-License-Identifier: Apache-2.0
"""Two more boot stacks on a real boot (lab/stacks.py): Debian 12 with dracut (GRUB stays)
and Debian 12 with systemd-boot (kernel-install, /etc/kernel/cmdline, BLS entries on the
ESP). apply → reboot → our arguments and vfio-pci from the initramfs → undo → reboot →
clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
CARD = ["0000:01:00.0", "0000:01:00.1"]
pytestmark = pytest.mark.lab


@pytest.mark.parametrize(
    ("stack", "bootloader", "initramfs"),
    [("dracut", "grub", "dracut"), ("systemd-boot", "systemd-boot", "initramfs-tools")],
)
def test_boot_stack_apply_reboot_undo(
    tmp_path: Path, stack: str, bootloader: str, initramfs: str
) -> None:
    assert os.geteuid() == 0, "the stack images are built with debootstrap: run as root (CI does)"
    tools = ["qemu-system-x86_64", "debootstrap", "mkfs.ext4", "mkfs.vfat", "mcopy", "sfdisk"]
    tools += ["ssh", "ssh-keygen"] + (["grub-mkstandalone"] if bootloader == "grub" else [])
    for tool in tools:
        assert shutil.which(tool), f"{tool} is required (scripts/setup.sh test installs it)"
    artifacts = Path(os.environ.get("PASSTHROUGH_LAB_ARTIFACTS", REPO / "lab-artifacts"))
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "lab/stacks.py"),
            stack,
            "--json",
            "--artifacts",
            str(artifacts / stack),
            "--keep",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )
    (tmp_path / "lab.log").write_text(r.stderr)
    (tmp_path / "result.json").write_text(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["ok"] and result["stack"] == stack
    # discovery named the stack from the real tree, and the plan used its tools
    boot = result["first"]["boot"]
    assert (boot["bootloader"], boot["initramfs"]) == (bootloader, initramfs)
    applied = result["apply"]
    assert (applied["bootloader"], applied["initramfs"]) == (bootloader, initramfs)
    ran = [argv[0] for argv in applied["commands"]]
    if stack == "dracut":
        assert "dracut" in ran and "update-grub" in ran
        assert "rd.driver.pre=vfio-pci" in applied["args"]
    else:
        assert "update-initramfs" in ran and "kernel-install" in ran
    assert "iommu=pt" in applied["args"]
    # after the reboot: our arguments on the kernel's command line, vfio-pci in the
    # initramfs, both functions on vfio-pci (verify passed inside)
    on = result["applied"]
    assert set(applied["args"]) <= set(on["cmdline"])
    assert any(n.startswith("vfio-pci.ko") for n in on["initramfs"])
    assert on["drivers"] == dict.fromkeys(CARD, "vfio-pci")
    # undo: /etc as before, the next boot's entry without ours; after a reboot, clean
    assert not set(applied["args"]) & set(result["undo"]["boot_entry"].split())
    clean = result["clean"]
    assert not set(applied["args"]) & set(clean["cmdline"])
    assert clean["drivers"] == result["first"]["drivers"]
    assert all(d not in ("", "vfio-pci") for d in clean["drivers"].values())
    assert list(result["timings"]) == [
        "image",
        "boot (UEFI)",
        "first boot: discovery, baseline",
        "apply",
        "reboot after apply",
        "vfio-pci from the initramfs, verify",
        "undo",
        "reboot after undo",
        "clean",
    ]
