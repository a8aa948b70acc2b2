# SPDX-License-Identifier: Apache-2.0
"""Two more boot stacks on a real boot (lab/stacks.py): Debian 12 with dracut (GRUB stays)
and Debian 12 with systemd-boot (kernel-install, /etc/kernel/cmdline, BLS entries on the
ESP). apply → reboot → our arguments and vfio-pci from the initramfs → undo → reboot →
clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from .script import TOOLS, UEFI_TOOLS, run_lab_script

CARD = ["0000:01:00.0", "0000:01:00.1"]
pytestmark = pytest.mark.lab


@pytest.mark.parametrize(
    ("stack", "bootloader", "initramfs"),
    [("dracut", "grub", "dracut"), ("systemd-boot", "systemd-boot", "initramfs-tools")],
)
def test_boot_stack_apply_reboot_undo(
    tmp_path: Path, stack: str, bootloader: str, initramfs: str
) -> None:
    tools = TOOLS + UEFI_TOOLS + (["grub-mkstandalone"] if bootloader == "grub" else [])
    result = run_lab_script(tmp_path, "stacks.py", [stack], tools, 2400, stack)
    assert result["stack"] == stack
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
    # the card's display ID is shared with the negative case's display, so the plan binds
    # per device: the udev rule must be in the initramfs as well (dracut copied it only
    # once the plan named it in install_items; initramfs-tools copies it by itself)
    assert applied["binding"] == "driver_override"
    assert "40-passthrough-vfio.rules" in on["initramfs"]
    assert "passthrough-vfio.conf" in on["initramfs"]
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
