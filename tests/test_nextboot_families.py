# SPDX-License-Identifier: Apache-2.0
"""What the next boot gets on kernelstub (Pop!_OS), proxmox-boot-tool and unified kernel
images (journal/nextboot.py, boot/uki.py).

The UKIs are real PE images: a stub linked by this machine's real ``gcc``/``ld`` and
turned into an EFI application by the real ``objcopy``, which then adds the ``.cmdline``
section as systemd's documented objcopy recipe for UKIs does (``ukify`` is not installed
here). kernelstub and proxmox-boot-tool cannot exist here (Debian has neither): their
configuration files and entries are written in the test in their formats, and in the
CLI runs ``kernelstub`` in the tree is a **stand-in** (a shell script that takes nothing
in), run through chroot with the real dash.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from passthrough.actions import PlanRecord
from passthrough.boot import kernelstub, loaderentries, proxmox, readback
from passthrough.boot import uki as nextboot_pe
from passthrough.cli import main
from passthrough.host.root import HostRoot

from .conftest import build_variant
from .test_nextboot import runnable

OURS = "vfio-pci.ids=10de:2684,10de:22ba"
RECORD = PlanRecord.from_json(
    {"kernel_args": {"set": ["iommu=pt", OURS]}, "bootloader": "systemd-boot"}
)


def uki(tmp_path: Path, dest: Path, cmdline: str | None) -> Path:
    """A PE image built by the real toolchain, with a ``.cmdline`` section unless None."""
    work = tmp_path / "pe"
    work.mkdir(exist_ok=True)
    (work / "stub.c").write_text("int efi_main(void) { return 0; }\n")
    for argv in (
        ["gcc", "-c", "-fpic", "-o", "stub.o", "stub.c"],
        ["ld", "-shared", "-Bsymbolic", "-o", "stub.so", "stub.o"],
        ["objcopy", "--target=efi-app-x86_64", "stub.so", "stub.efi"],
    ):
        subprocess.run(argv, cwd=work, check=True, capture_output=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if cmdline is None:
        dest.write_bytes((work / "stub.efi").read_bytes())
        return dest
    (work / "cmdline").write_bytes(cmdline.encode() + b"\0")
    subprocess.run(
        [
            "objcopy",
            "--add-section",
            f".cmdline={work / 'cmdline'}",
            "--change-section-vma",
            ".cmdline=0x30000",
            "stub.efi",
            str(dest),
        ],
        cwd=work,
        check=True,
        capture_output=True,
    )
    return dest


# -- UKIs -----------------------------------------------------------------------------------


def test_the_cmdline_section_is_read_from_the_pe_headers(tmp_path: Path) -> None:
    path = uki(tmp_path, tmp_path / "a.efi", f"root=/dev/vda ro iommu=pt {OURS}")
    assert nextboot_pe.cmdline(str(path)) == ["root=/dev/vda", "ro", "iommu=pt", OURS]
    objdump = subprocess.run(
        ["objdump", "-h", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert " .cmdline " in objdump  # the real binutils see the section we read
    assert nextboot_pe.cmdline(str(uki(tmp_path, tmp_path / "b.efi", None))) is None
    (tmp_path / "c.efi").write_bytes(b"MZ" + b"\0" * 100)
    with pytest.raises(nextboot_pe.NotPE):
        nextboot_pe.cmdline(str(tmp_path / "c.efi"))


def test_ukis_are_judged_by_their_cmdline(tmp_path: Path) -> None:
    linux = tmp_path / "efi/EFI/Linux"
    uki(tmp_path, linux / "arch-6.11.efi", f"root=/dev/vda rw iommu=pt {OURS}")
    uki(tmp_path, linux / "arch-6.10.efi", "root=/dev/vda rw iommu=pt")
    uki(tmp_path, linux / "other.efi", None)
    (linux / "broken.efi").write_bytes(b"not a PE image")
    out = readback.NextBoot()
    loaderentries.check_loader_entries(HostRoot(str(tmp_path)), RECORD, out)
    assert out.missing == [f"/efi/EFI/Linux/arch-6.10.efi (.cmdline): {OURS}"]
    assert out.checked == ["/efi/EFI/Linux/arch-6.10.efi", "/efi/EFI/Linux/arch-6.11.efi"]
    assert out.unchecked == [
        "/efi/EFI/Linux/broken.efi (not a readable PE image: no MZ header)",
        "/efi/EFI/Linux/other.efi (no .cmdline section: the loader gives the line)",
    ]


# -- kernelstub -----------------------------------------------------------------------------


def _kernelstub(root: Path, options: list[str], entry: str | None) -> None:
    config = {"user": {"kernel_options": options, "esp_path": "/boot/efi"}}
    (root / "etc/kernelstub").mkdir(parents=True, exist_ok=True)
    (root / "etc/kernelstub/configuration").write_text(json.dumps(config))
    if entry is not None:
        entries = root / "boot/efi/loader/entries"
        entries.mkdir(parents=True, exist_ok=True)
        (entries / "Pop_OS-current.conf").write_text(
            f"title Pop!_OS\nlinux /EFI/Pop_OS-u1/vmlinuz.efi\noptions {entry}\n"
        )
        (entries / "Recovery-ABCD.conf").write_text("title Recovery\noptions boot=casper\n")


def test_kernelstub_configuration_and_its_entry(tmp_path: Path) -> None:
    _kernelstub(tmp_path, ["quiet", "iommu=pt", OURS], f"root=UUID=u1 ro quiet iommu=pt {OURS}")
    out = readback.NextBoot()
    kernelstub.check_kernelstub(HostRoot(str(tmp_path)), RECORD, out)
    # the recovery entry is not kernelstub's: not read
    assert out.missing == [] and out.checked == [
        "/etc/kernelstub/configuration",
        "/boot/efi/loader/entries/Pop_OS-current.conf",
    ]
    _kernelstub(tmp_path, ["quiet", "iommu=pt", OURS], "root=UUID=u1 ro quiet iommu=pt")
    out = readback.NextBoot()
    kernelstub.check_kernelstub(HostRoot(str(tmp_path)), RECORD, out)
    assert out.missing == [f"/boot/efi/loader/entries/Pop_OS-current.conf: {OURS}"]


def test_kernelstub_without_its_files_is_named_not_checked(tmp_path: Path) -> None:
    out = readback.NextBoot()
    kernelstub.check_kernelstub(HostRoot(str(tmp_path)), RECORD, out)
    assert out.unchecked == ["/etc/kernelstub/configuration (absent or not kernelstub's JSON)"]
    _kernelstub(tmp_path, [OURS, "iommu=pt"], None)
    out = readback.NextBoot()
    kernelstub.check_kernelstub(HostRoot(str(tmp_path)), RECORD, out)
    assert out.checked == ["/etc/kernelstub/configuration"] and out.missing == []
    assert out.unchecked == ["kernelstub's loader entries (none in /boot/efi/loader/entries)"]


@pytest.mark.root
def test_a_kernelstub_that_took_nothing_stops_before_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build_variant(tmp_path, "consumer-intel", distro="popos-22.04")
    runnable(path)
    (path / "usr/bin/kernelstub").write_text("#!/bin/sh\nexit 0\n")
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 5
    out, err = capsys.readouterr()
    assert "Reboot" not in out
    (line,) = err.strip().splitlines()[-1:]
    assert f"/etc/kernelstub/configuration (user kernel_options): {OURS}" in line, line
    assert main(["undo", "--root", str(path)]) == 0


# -- proxmox-boot-tool ----------------------------------------------------------------------


def test_proxmox_reads_each_mounted_esp_and_names_the_others(tmp_path: Path) -> None:
    (tmp_path / "etc/kernel").mkdir(parents=True)
    (tmp_path / "etc/kernel/proxmox-boot-uuids").write_text(
        "5B2C-1A7E\n7C3D-2B8F\n9E4F-3C9A grub\n"
    )
    entries = tmp_path / "var/tmp/espmounts/5B2C-1A7E/loader/entries"
    entries.mkdir(parents=True)
    (entries / "proxmox-6.8.12-4-pve.conf").write_text(
        "title Proxmox VE\nlinux /EFI/proxmox/6.8.12-4-pve/vmlinuz-6.8.12-4-pve\n"
        "options root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt\n"
    )
    out = readback.NextBoot()
    proxmox.check_proxmox(HostRoot(str(tmp_path)), RECORD, out)
    esp = "/var/tmp/espmounts/5B2C-1A7E/loader/entries/proxmox-6.8.12-4-pve.conf"
    assert out.missing == [f"{esp}: {OURS}"] and out.checked == [esp]
    assert out.unchecked == [
        "ESP 7C3D-2B8F (not mounted at /var/tmp/espmounts/7C3D-2B8F: its loader entries were not read)",
        "ESP 9E4F-3C9A (synced for GRUB: its grub.cfg is the root's)",
    ]


def test_proxmox_without_its_uuids_file_is_named(tmp_path: Path) -> None:
    out = readback.NextBoot()
    proxmox.check_proxmox(HostRoot(str(tmp_path)), RECORD, out)
    assert out.unchecked == ["the ESPs (no /etc/kernel/proxmox-boot-uuids)"]


@pytest.mark.root
def test_a_uki_without_our_arguments_stops_before_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A UKI on the ESP built (by the real toolchain) with the old command line, and
    kernel-install in the tree a stand-in that does not rebuild it: its .cmdline lacks
    ours, whatever /etc/kernel/cmdline now says."""
    path = build_variant(tmp_path, "turing-desktop", distro="arch")
    runnable(path)
    uki(tmp_path, path / "boot/EFI/Linux/arch.efi", "root=UUID=u1 rw quiet")
    (path / "usr/bin/kernel-install").write_text("#!/bin/sh\nexit 0\n")
    capsys.readouterr()
    code = main(["apply", "--root", str(path)])
    out, err = capsys.readouterr()
    assert code == 5, (out, err)
    (line,) = err.strip().splitlines()[-1:]
    assert "/boot/EFI/Linux/arch.efi (.cmdline): iommu=pt vfio-pci.ids=10de:1e87" in line, line
    assert main(["undo", "--root", str(path)]) == 0
