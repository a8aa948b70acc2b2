# SPDX-License-Identifier: Apache-2.0
"""The Secure Boot CAs a Windows guest's firmware starts with: the variable store template
of the root's firmware descriptor that libvirt picks for Secure Boot with enrolled keys
(host/qemu.py), read with guest/secureboot.py. ``check`` reports it; ``validate`` warns on a
Secure Boot domain whose template holds only the 2011 CAs."""

from __future__ import annotations

from passthrough.guest.secureboot import FIX_2011, ONLY_2011, StoreCas, vars_file_cas
from passthrough.host.qemu import read_qemu
from passthrough.host.root import HostRoot
from passthrough.model import CheckResult, Level

CHECK_ID = "guest-secure-boot-cas"


def template_cas(root: HostRoot) -> tuple[str, StoreCas] | None:
    """(template path, its CAs) of the firmware libvirt picks for Secure Boot with enrolled
    keys; None where the root has no such descriptor or its template cannot be read."""
    firmware = read_qemu(root).secure_firmware
    if firmware is None or not firmware.vars_template:
        return None
    data = root.read_bytes(firmware.vars_template.lstrip("/"))
    if data is None:
        return None
    return firmware.vars_template, vars_file_cas(data)


def secure_boot_check(root: HostRoot) -> CheckResult:
    found = template_cas(root)
    firmware = read_qemu(root).secure_firmware
    if found is None and firmware is not None:
        return CheckResult(
            CHECK_ID,
            Level.INFO,
            f"{firmware.descriptor} names the variable store {firmware.vars_template}, "
            "which this root does not hold: its Secure Boot CAs are not known",
        )
    if found is None:
        return CheckResult(
            CHECK_ID,
            Level.INFO,
            "no firmware with Secure Boot and Microsoft keys in this root's "
            "/usr/share/qemu/firmware (a Windows 11 guest needs one)",
            "install OVMF (ovmf on Debian and Ubuntu, edk2-ovmf on the RHEL family and Fedora)",
        )
    path, cas = found
    if cas.only_2011:
        return CheckResult(CHECK_ID, Level.WARN, f"{path} {ONLY_2011}", FIX_2011)
    level = Level.PASS if 2023 in cas.microsoft.values() else Level.INFO
    return CheckResult(CHECK_ID, level, f"{path}: {cas.summary()}")
