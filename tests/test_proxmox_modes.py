# SPDX-License-Identifier: Apache-2.0
"""proxmox-boot-tool's two ways of keeping its ESPs, and which file each one reads.

Its kernel hook (``zz-proxmox-boot``, proxmox-kernel-helper) writes systemd-boot entries
whose ``options`` are the first line of /etc/kernel/cmdline only on a UEFI boot whose ESPs
hold no GRUB; booted by BIOS (or by GRUB on UEFI: Secure Boot installs) it runs update-grub
for each ESP, and then the kernel line is /etc/default/grub's — /etc/kernel/cmdline is read
by nothing but its ``root=`` check. Proxmox's ``/etc/grub.d/000_proxmox_boot_header`` makes
a plain ``update-grub`` run ``proxmox-boot-tool refresh``. The tool reads which way from the
firmware (no /sys/firmware/efi: BIOS) and the EFI variables (variables there and no
LoaderInfo among them: GRUB booted), and writes the file that way reads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .bootread import grub_line, proxmox_first_line
from .cli_process import run_cli

GPU = "0000:24:00.0"
OURS = "vfio-pci.ids=10de:2504,10de:228e"
LOADER_INFO = "sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
OTHER_VAR = "sys/firmware/efi/efivars/BootCurrent-8be4df61-93ca-11d0-aa0d-00e098032b8c"


def _root(hosts: dict[str, Path], tmp_path: Path, firmware: str) -> Path:
    root = tmp_path / "root"
    shutil.copytree(hosts["acs-override-proxmox"], root, symlinks=True)
    efi = root / "sys/firmware/efi"
    if firmware == "bios":
        shutil.rmtree(efi)
    elif firmware == "systemd-boot":
        (root / LOADER_INFO).write_bytes(b"\x06\x00\x00\x00s\x00d\x00")
    elif firmware == "grub-on-uefi":
        (root / OTHER_VAR).write_bytes(b"\x06\x00\x00\x00\x01\x00")
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and "passthrough" not in p.parts[-3:]
    }


def test_a_bios_boot_gets_our_arguments_through_grub(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _root(hosts, tmp_path, "bios")
    cmdline_before = (root / "etc/kernel/cmdline").read_bytes()
    plan = run_cli(["plan", "--root", str(root), "--gpu", GPU, "--json"])
    assert plan.returncode == 0, plan.stderr
    assert '"bootloader": "grub"' in plan.stdout
    applied = run_cli(["apply", "--root", str(root), "--gpu", GPU, "--yes"])
    assert applied.returncode == 0, applied.stderr
    # what update-grub builds each ESP's grub.cfg from carries ours; the file
    # proxmox-boot-tool would copy on a systemd-boot ESP is left as it was
    assert OURS in grub_line(root, tmp_path)
    assert (root / "etc/kernel/cmdline").read_bytes() == cmdline_before
    assert "update-grub" in applied.stdout


def test_grub_booted_on_uefi_is_the_grub_way_too(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = _root(hosts, tmp_path, "grub-on-uefi")
    applied = run_cli(["apply", "--root", str(root), "--gpu", GPU, "--yes"])
    assert applied.returncode == 0, applied.stderr
    assert OURS in grub_line(root, tmp_path)
    assert OURS not in proxmox_first_line(root)


def test_a_systemd_boot_esp_gets_our_arguments_on_the_first_line(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _root(hosts, tmp_path, "systemd-boot")
    applied = run_cli(["apply", "--root", str(root), "--gpu", GPU, "--yes"])
    assert applied.returncode == 0, applied.stderr
    assert OURS in proxmox_first_line(root)
    assert not (root / "etc/default/grub.d/99-passthrough.cfg").exists()


def test_efi_variables_unseen_keep_the_systemd_boot_way(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """No variable to read (efivarfs not mounted): a UEFI Proxmox on ZFS is systemd-boot's
    by default, as before."""
    root = _root(hosts, tmp_path, "uefi-unseen")
    plan = run_cli(["plan", "--root", str(root), "--gpu", GPU, "--json"])
    assert '"bootloader": "proxmox-boot-tool"' in plan.stdout


def test_grub_way_without_proxmoxs_header_is_refused(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _root(hosts, tmp_path, "bios")
    (root / "etc/grub.d/000_proxmox_boot_header").unlink()
    before = _files(root)
    got = run_cli(["apply", "--root", str(root), "--gpu", GPU, "--yes"])
    assert got.returncode == 2
    line = got.stderr.strip()
    assert line.count("\n") == 0 and "000_proxmox_boot_header is missing" in line, line
    assert _files(root) == before
