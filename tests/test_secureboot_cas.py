# SPDX-License-Identifier: Apache-2.0
"""The Microsoft Secure Boot CAs of a firmware variable store, read from the EFI signature
lists of Debian's real OVMF files (package ovmf: OVMF_VARS_4M.ms.fd enrols Microsoft's
keys, OVMF_VARS_4M.fd none), and what `check` says of the store a Windows guest gets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from passthrough.guest.secureboot import (
    GLOBAL_GUID,
    IMAGE_SECURITY_GUID,
    efivar_cas,
    variables,
    vars_file_cas,
)
from tests.cli_process import run_cli

OVMF = Path("/usr/share/OVMF")
MS_VARS = OVMF / "OVMF_VARS_4M.ms.fd"
BLANK_VARS = OVMF / "OVMF_VARS_4M.fd"
MS_2011 = {
    "Microsoft Corporation KEK CA 2011",
    "Microsoft Windows Production PCA 2011",
    "Microsoft Corporation UEFI CA 2011",
}

pytestmark = pytest.mark.skipif(not MS_VARS.exists(), reason="needs Debian's ovmf package")


def test_debians_microsoft_store_holds_the_2011_cas_only() -> None:
    cas = vars_file_cas(MS_VARS.read_bytes())
    assert cas.db == ("Microsoft Windows Production PCA 2011", "Microsoft Corporation UEFI CA 2011")
    assert cas.kek is not None and "Microsoft Corporation KEK CA 2011" in cas.kek
    assert set(cas.microsoft) == MS_2011 and set(cas.microsoft.values()) == {2011}
    assert cas.only_2011


def test_the_blank_store_holds_no_keys() -> None:
    cas = vars_file_cas(BLANK_VARS.read_bytes())
    assert cas.db is None and cas.kek is None and cas.microsoft == {}
    assert not cas.only_2011


def test_efivarfs_files_read_the_same() -> None:
    """efivarfs gives a variable as four bytes of attributes, then its data."""
    found = variables(MS_VARS.read_bytes())
    attrs = (0x27).to_bytes(4, "little")
    db, kek = found[("db", IMAGE_SECURITY_GUID)], found[("KEK", GLOBAL_GUID)]
    assert efivar_cas(attrs + db, attrs + kek) == vars_file_cas(MS_VARS.read_bytes())
    assert efivar_cas(None, None).microsoft == {}


def test_garbage_is_no_store() -> None:
    assert vars_file_cas(b"\xaa\x55" * 5000).microsoft == {}
    assert vars_file_cas(b"").db is None


def _root_with(hosts: dict[str, Path], tmp_path: Path, template: Path | None) -> Path:
    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    if template is not None:
        (root / "usr/share/OVMF").mkdir(parents=True)
        shutil.copy(template, root / "usr/share/OVMF/OVMF_VARS_4M.ms.fd")
    return root


def _check(root: Path) -> dict[str, str]:
    r = run_cli(["check", "--root", str(root), "--json"])
    assert r.returncode in (0, 1), r.stderr
    return next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "guest-secure-boot-cas")


def test_check_warns_where_the_windows_store_holds_only_2011(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    found = _check(_root_with(hosts, tmp_path, MS_VARS))
    assert found["level"] == "WARN"
    assert "only Microsoft's 2011 CAs" in found["summary"] and "2023" in found["summary"]


def test_check_says_where_the_store_is_not_in_the_root(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    found = _check(_root_with(hosts, tmp_path, None))
    assert found["level"] == "INFO" and "does not hold" in found["summary"]


def test_validate_warns_on_a_secure_boot_domain_whose_template_holds_only_2011(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _root_with(hosts, tmp_path, MS_VARS)
    r = run_cli(["render", "--root", str(root), "--name", "w", "--profile", "windows"])
    assert r.returncode == 0, r.stderr
    xml = tmp_path / "w.xml"
    xml.write_text(r.stdout)
    r = run_cli(["validate", str(xml), "--host-root", str(root)])
    assert r.returncode == 0, r.stdout + r.stderr  # a warning, not a failure
    assert "warning host-secure-boot-2011 [host] /domain/os:" in r.stdout
    r = run_cli(["validate", str(xml), "--host-root", str(root), "--strict"])
    assert r.returncode == 1
    # a Linux guest (Secure Boot off) and a store with no Microsoft keys: nothing to say
    r = run_cli(["render", "--root", str(root), "--name", "l"])
    xml.write_text(r.stdout)
    r = run_cli(["validate", str(xml), "--host-root", str(root)])
    assert "host-secure-boot-2011" not in r.stdout
