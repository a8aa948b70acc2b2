# SPDX-License-Identifier: Apache-2.0
"""The lab: a real Debian 12 kernel under QEMU with an emulated Intel IOMMU (TCG), the
toolkit run inside it over SSH. See lab/run.py for the stages."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from .script import REPO, TOOLS, UEFI_TOOLS, run_lab_script

pytestmark = pytest.mark.lab


def _run_lab(tmp_path: Path, *flags: str) -> dict[str, Any]:
    tools = TOOLS + (["grub-mkstandalone", *UEFI_TOOLS] if "--full" in flags else [])
    # the full chain with both nested boots: 20 min on a quiet machine, 56 min at load 7-8
    return run_lab_script(tmp_path, "run.py", list(flags), tools, 4500, "")


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
    """UEFI + GRUB from the disk; `passthrough provision` applies the host play over SSH as a
    sudo user (the real update-initramfs and update-grub inside) and Ansible reboots it; the
    same play again changes nothing; the card comes up on
    vfio-pci; the vm play starts a guest under the lab host's own libvirt with both functions;
    a nested guest boots a real kernel with the card and a 64 GiB BAR and reports what it
    sees with the planner's layout (the break without it: test_firmware_window.py); the
    admin edits /etc/default/grub after apply and their argument boots with ours; a
    deliberately broken binding makes verify fail;
    undo and a reboot bring it all back, keeping the admin's edit."""
    # without the nested break: tests/lab/test_firmware_window.py boots the same kernel
    # without the planner's layout (`lab/run.py --full` alone still makes it here)
    result = _run_lab(tmp_path, "--full", "--no-nested-break")
    card = ["0000:01:00.0", "0000:01:00.1"]
    # Ansible logged in as an ordinary user and became root through sudo; the host play run
    # a second time on the prepared host changed nothing and did not reboot
    assert result["ansible_user"] == "lab" and result["host_again"]["sudo_commands"] > 0
    again = result["host_again"]["host"]
    assert again["changed"] == 0 and again["ok"] > 0 and not again["reboot_required"]
    assert again["failed"] == 0 and again["unreachable"] == 0
    # the lab host had no library (its python3 could not import it, no venv): the first
    # play installed the controller's into the collection's venv, the second left it as it
    # was (the same identity, neither the venv nor the identity file written again)
    assert result["bare_host"] == "ModuleNotFoundError: No module named 'passthrough'"
    runtime = result["runtime"]
    assert (
        runtime["library"]
        == "/opt/passthrough/venv/lib/python3.11/site-packages/passthrough/__init__.py"
    )
    if str(REPO / "playbooks") not in sys.path:
        sys.path.append(str(REPO / "playbooks"))
    from ansible_collections.passthrough.gpu.plugins.plugin_utils.runtime import identity

    assert runtime["identity"] == identity() and runtime["install_seconds"] > 0
    assert result["host_again"]["runtime"] == runtime
    assert result["guest"]["attached"] == card and result["guest"]["qemu_vfio_devices"] == 2
    assert set(result["guest"]["drivers_after"].values()) == {"vfio-pci"}
    # the nested guest booted its kernel through OVMF and printed its own view: the card
    # and the large-BAR stand-in at the guest addresses the XML promised, every BAR at full
    # size, the 64 GiB BAR inside the window the planner chose
    nested = result["nested"]
    assert nested["addresses"] == {
        "0000:01:00.0": "0000:01:00.0",
        "0000:01:00.1": "0000:01:00.1",
        "0000:03:00.0": "0000:02:00.0",
    }
    big, window = nested["big_bar"], nested["window"]
    assert big["size"] == 64 << 30
    assert (
        window["base"] <= big["start"]
        and big["start"] + big["size"] <= window["base"] + window["size"]
    )
    assert result["nested_break"] is None
    # the broken binding: verify failed naming the companion function, which a host driver took
    assert result["break"]["verify_rc"] != 0
    assert any("0000:01:00.1" in f for f in result["break"]["failures"])
    assert result["break"]["drivers"]["0000:01:00.1"] not in ("", "vfio-pci")
    assert result["break"]["drivers"]["0000:01:00.0"] == "vfio-pci"
    assert all(d != "vfio-pci" for d in result["drivers_after_undo"].values())
    # the admin's edit of /etc/default/grub after apply (one more argument, update-grub) is on
    # the kernel's command line after the break's reboot, ahead of ours; undo keeps their edit
    # (the lab compares that file with the baseline plus the edit) and only ours go
    admin = result["admin_edit"]
    assert admin["admin"] and admin["ours"] and "iommu=pt" in admin["args"]
    words = admin["cmdline"].split()
    assert "lab.admin_edit=1" in words and set(admin["args"]) <= set(words)
    assert words.index("lab.admin_edit=1") < min(words.index(a) for a in admin["args"])
    assert "lab.admin_edit=1" in admin["grub_cfg"].split()
    after = admin["cmdline_after_undo"].split()
    assert "lab.admin_edit=1" in after and not set(admin["args"]) & set(after)
    assert list(result["timings"]) == [
        "image",
        "boot (UEFI, GRUB from disk)",
        "provision host.yml (apply, Ansible reboot, verify)",
        "provision host.yml again: 0 changed",
        "verify",
        "guest under the lab host's libvirt (vm.yml)",
        "nested guest: initramfs, render with the planner",
        "nested guest boots (planned layout), its view read",
        "admin edits /etc/default/grub after apply, update-grub",
        "break: companion override removed, reboot, verify fails",
        "admin's argument and ours in /proc/cmdline",
        "undo",
        "reboot after undo",
        "back to the original",
    ]
