# SPDX-License-Identifier: Apache-2.0
"""The fast boot check of each boot stack (lab/bootcheck.py): the stack's cached tree applied
with `apply --root` natively (its own dracut/update-grub, update-initramfs/kernel-install in
the sandbox), then booted once through OVMF and its own bootloader and initramfs with a
checking init as PID 1; undone and booted again. No SSH: the console says what the boot got."""

from __future__ import annotations

from pathlib import Path

import pytest

from .script import TOOLS, UEFI_TOOLS, run_lab_script

pytestmark = pytest.mark.lab
CHECK_INIT = "init=/usr/local/sbin/lab-check"
ADMIN_ARG = "lab.admin_edit=1"


@pytest.mark.parametrize(
    ("stack", "bootloader", "initramfs"),
    [("dracut", "grub", "dracut"), ("systemd-boot", "systemd-boot", "initramfs-tools")],
)
def test_boot_check_apply_boot_undo_boot(
    tmp_path: Path, stack: str, bootloader: str, initramfs: str
) -> None:
    tools = TOOLS + UEFI_TOOLS + (["grub-mkstandalone"] if bootloader == "grub" else [])
    # two TCG boots to the checking init and two native regenerations: minutes, with room
    # for a loaded machine
    result = run_lab_script(tmp_path, "bootcheck.py", [stack], tools, 1800, f"bootcheck-{stack}")
    assert result["stack"] == stack
    applied = result["apply"]
    # the plan read the stack from the real tree and ran its own tools
    assert (applied["bootloader"], applied["initramfs"]) == (bootloader, initramfs)
    ran = [argv[0] for argv in applied["commands"]]
    if stack == "dracut":
        assert "dracut" in ran and "update-grub" in ran
        assert "rd.driver.pre=vfio-pci" in applied["args"]
    else:
        assert "update-initramfs" in ran and "kernel-install" in ran
    assert "iommu=pt" in applied["args"]
    assert applied["binding"] == "driver_override"
    # the applied boot: ours and the admin's init on the kernel's command line, both card
    # functions on vfio-pci, loaded before PID 1 (the checking init loads nothing)
    on = result["applied"]
    assert set(applied["args"]) <= set(on["cmdline"])
    assert CHECK_INIT in on["cmdline"]
    assert on["vfio_pci_module"]
    assert {a: on["drivers"][a] for a in ("0000:01:00.0", "0000:01:00.1")} == {
        "0000:01:00.0": "vfio-pci",
        "0000:01:00.1": "vfio-pci",
    }
    # the negative case's display shares the card's ID and stays off vfio-pci
    assert on["drivers"]["0000:02:01.0"] != "vfio-pci"
    # undo: /etc as before (the script compares every file); the undone boot: none of ours,
    # the admin's init kept, the card off vfio-pci
    off = result["undone"]
    assert not set(applied["args"]) & set(off["cmdline"])
    assert CHECK_INIT in off["cmdline"]
    assert all(off["drivers"][a] != "vfio-pci" for a in ("0000:01:00.0", "0000:01:00.1"))
    assert not off["vfio_pci_module"]  # our module list is out of the initramfs
    assert list(result["timings"]) == [
        "tree: copy, checking init, the card's sysfs",
        "plan, apply --root",
        "boot after apply",
        "undo --root",
        "boot after undo",
    ]


def test_boot_check_upstream_grub(tmp_path: Path) -> None:
    """The lab's tree with upstream's grub-mkconfig (no grub.d) and no update-grub: plan
    --iommu-only writes our marked line into /etc/default/grub, apply's grub-mkconfig puts
    ours on the entry the boot takes; the admin's later sed and grub-mkconfig boot with ours;
    undo takes ours back and keeps the admin's edit (the script compares /etc by hash: every
    file as before apply, /etc/default/grub the original with the admin's edit)."""
    tools = [*TOOLS, *UEFI_TOOLS, "grub-mkstandalone"]
    result = run_lab_script(
        tmp_path, "bootcheck.py", ["upstream-grub"], tools, 1800, "bootcheck-upstream-grub"
    )
    applied = result["apply"]
    assert applied["bootloader"] == "grub"
    assert applied["writes"] == ["/etc/default/grub"]
    assert applied["commands"] == [["grub-mkconfig", "-o", "/boot/grub/grub.cfg"]]
    assert applied["grub_marker"] and not applied["grub_dropin"]
    assert "iommu=pt" in applied["args"]
    on = result["applied"]
    assert set(applied["args"]) <= set(on["cmdline"]) and CHECK_INIT in on["cmdline"]
    # the admin's arguments before ours, which our line appends to their value
    words = on["cmdline"]
    assert ADMIN_ARG in words
    assert words.index(ADMIN_ARG) < min(words.index(a) for a in applied["args"])
    assert words.index(CHECK_INIT) < min(words.index(a) for a in applied["args"])
    # kernel arguments only: nothing binds the card
    assert not on["vfio_pci_module"]
    assert all(on["drivers"][a] != "vfio-pci" for a in ("0000:01:00.0", "0000:01:00.1"))
    off = result["undone"]
    assert not set(applied["args"]) & set(off["cmdline"])
    assert CHECK_INIT in off["cmdline"] and ADMIN_ARG in off["cmdline"]
    assert list(result["timings"]) == [
        "tree: copy, checking init, the card's sysfs",
        "plan, apply --root",
        "admin edits /etc/default/grub, grub-mkconfig",
        "boot after apply",
        "undo --root",
        "boot after undo",
    ]
