# SPDX-License-Identifier: Apache-2.0
# ruff: noqa: F811  (pytest fixtures imported from tests/test_guest.py, taken as arguments)
"""Two guest check lines beyond the GPU itself, on the REAL H100 guest capture
(tests/fixtures/h100-guest):

- ``secure-boot-cas``: the Microsoft CAs in the guest's own db and KEK, read from efivarfs.
  The efivarfs files are built here from Debian's real ``OVMF_VARS_4M.ms.fd`` (package ovmf:
  it enrols Microsoft's 2011 keys): its db and KEK signature lists, extracted with the
  reader's own ``variables``, written with efivarfs' four bytes of attributes first. The
  2023 case adds a certificate made here by the real ``openssl`` with a 2023 CA's subject.
- ``vgpu``: the vGPU type and licence state. The recorded ``nvidia-smi -q -x`` of the
  capture is a passthrough GPU (``Pass-Through``); the vGPU variants change that recording
  in the way a vGPU guest's nvidia-smi reports (spelled out in ``_as_vgpu``).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from passthrough.guest.check import run_guest_checks
from passthrough.guest.report import PASS, SKIP, WARN, GuestCheck, GuestReport, render
from passthrough.guest.root import GuestRoot
from passthrough.guest.runner import RecordedRunner
from passthrough.guest.secureboot import (
    DB_EFIVAR,
    GLOBAL_GUID,
    IMAGE_SECURITY_GUID,
    KEK_EFIVAR,
    SECURE_BOOT_EFIVAR,
    X509_GUID,
    variables,
)

from .test_guest import capture, variant  # noqa: F401  (the capture, and a copy to change)

MS_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
ATTRS = (0x27).to_bytes(4, "little")  # NV | BS | RT | time-based authenticated write
needs_ovmf = pytest.mark.skipif(not MS_VARS.exists(), reason="needs Debian's ovmf package")


def _report(variant: tuple[Path, Path]) -> GuestReport:
    return run_guest_checks(GuestRoot(str(variant[0])), RecordedRunner(str(variant[1])))


def _check(report: GuestReport, check_id: str) -> GuestCheck:
    return next(c for c in report.checks if c.id == check_id)


def _efivars(root: Path, db: bytes, kek: bytes, secure_boot: int | None) -> None:
    efivars = root / "sys/firmware/efi/efivars"
    efivars.mkdir(parents=True)
    (root / DB_EFIVAR).write_bytes(ATTRS + db)
    (root / KEK_EFIVAR).write_bytes(ATTRS + kek)
    if secure_boot is not None:
        (root / SECURE_BOOT_EFIVAR).write_bytes((0x06).to_bytes(4, "little") + bytes([secure_boot]))


def _ms_lists() -> tuple[bytes, bytes]:
    found = variables(MS_VARS.read_bytes())
    return found[("db", IMAGE_SECURITY_GUID)], found[("KEK", GLOBAL_GUID)]


def _x509_list(der: bytes) -> bytes:
    """One EFI_SIGNATURE_LIST of type X.509 holding ``der`` (owner GUID, then the DER)."""
    entry = uuid.UUID("77fa9abd-0359-4d32-bd60-28f4e78f784b").bytes_le + der
    return struct.pack("<16sIII", X509_GUID.bytes_le, 28 + len(entry), 0, len(entry)) + entry


@needs_ovmf
def test_only_the_2011_cas_warn_with_the_2023_consequence(variant: tuple[Path, Path]) -> None:
    db, kek = _ms_lists()
    _efivars(variant[0], db, kek, secure_boot=1)
    report = _report(variant)
    cas = _check(report, "secure-boot-cas")
    assert cas.level == WARN
    assert cas.summary.startswith("Secure Boot on; db and KEK: ")
    for name in (
        "Microsoft Corporation KEK CA 2011",
        "Microsoft Windows Production PCA 2011",
        "Microsoft Corporation UEFI CA 2011",
    ):
        assert name in cas.summary
    assert "2023" in cas.summary and "option ROMs" in cas.summary
    assert cas.fix is not None and "--reset-nvram" in cas.fix
    assert cas.data["db"] == [
        "Microsoft Windows Production PCA 2011",
        "Microsoft Corporation UEFI CA 2011",
    ]
    assert not report.failed  # a warning: the verdict stays a pass
    assert "fix: this store was copied" in render(report)


@needs_ovmf
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_a_2023_ca_passes_and_secure_boot_off_is_said(
    variant: tuple[Path, Path], tmp_path: Path
) -> None:
    key, cert = tmp_path / "k.pem", tmp_path / "c.der"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    subject = ["-subj", "/CN=Windows UEFI CA 2023"]
    subprocess.run(
        [*openssl, *subject, "-keyout", str(key), "-outform", "DER", "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    db, kek = _ms_lists()
    _efivars(variant[0], db + _x509_list(cert.read_bytes()), kek, secure_boot=0)
    cas = _check(_report(variant), "secure-boot-cas")
    assert cas.level == PASS
    assert cas.summary.startswith("Secure Boot off; db and KEK: ")
    assert "Windows UEFI CA 2023 (db: Windows boot manager)" in cas.summary
    assert "Microsoft Corporation UEFI CA 2011" in cas.summary


def test_no_efi_or_no_efivars_is_a_skip(variant: tuple[Path, Path]) -> None:
    before = _report(variant)  # the real capture: a guest with no /sys/firmware/efi
    cas = _check(before, "secure-boot-cas")
    assert (cas.level, cas.summary) == (
        SKIP,
        "not an EFI guest: no /sys/firmware/efi in this root (or it was not recorded)",
    )
    (variant[0] / "sys/firmware/efi").mkdir(parents=True)
    cas = _check(_report(variant), "secure-boot-cas")
    assert cas.level == SKIP and cas.summary.startswith("no efivars")
    (variant[0] / "sys/firmware/efi/efivars").mkdir()  # efivars, but no keys enrolled
    cas = _check(_report(variant), "secure-boot-cas")
    assert cas.level == SKIP and "no Secure Boot keys enrolled" in cas.summary


def _as_vgpu(commands: Path, product: str, license_status: str | None) -> None:
    """The recording as a vGPU guest reports it: virtualization mode VGPU, the vGPU type as
    the product name, and a vGPU Software Licensed Product element with its status."""
    path = commands / "nvidia-smi-q.xml"
    tree = ET.parse(path)
    gpu = tree.getroot().find("gpu")
    assert gpu is not None
    mode = gpu.find("gpu_virtualization_mode/virtualization_mode")
    name = gpu.find("product_name")
    assert mode is not None and name is not None
    mode.text, name.text = "VGPU", product
    if license_status is not None:
        licensed = ET.SubElement(gpu, "vgpu_software_licensed_product")
        ET.SubElement(licensed, "licensed_product_name").text = "NVIDIA Virtual Compute Server"
        ET.SubElement(licensed, "license_status").text = license_status
    tree.write(path)


@pytest.mark.parametrize(
    ("status", "level"),
    [
        ("Licensed (Expiry: 2027-1-5 8:59:59 GMT)", PASS),
        ("Unlicensed (Restricted)", WARN),
        (None, WARN),
    ],
)
def test_a_vgpu_guest_names_its_type_and_licence(
    variant: tuple[Path, Path], status: str | None, level: str
) -> None:
    _as_vgpu(variant[1], "NVIDIA H100XM-80C", status)
    report = _report(variant)
    vgpu = _check(report, "vgpu")
    assert vgpu.level == level
    assert "0000:00:06.0 NVIDIA H100XM-80C" in vgpu.summary
    assert (status or "licence status not reported") in vgpu.summary
    if status is not None:
        assert "NVIDIA Virtual Compute Server" in vgpu.summary
    assert vgpu.data["vgpus"]["0000:00:06.0"]["license"] == status
    assert _check(report, "nvidia-smi").level == PASS
    assert not report.failed


def test_a_passthrough_gpu_is_no_vgpu_and_changes_no_verdict(variant: tuple[Path, Path]) -> None:
    report = _report(variant)
    vgpu = _check(report, "vgpu")
    assert vgpu.level == SKIP and vgpu.summary.startswith("no vGPU")
    assert not report.failed
    assert [c.level for c in report.checks if c.level not in (SKIP,)].count(PASS) == 7
