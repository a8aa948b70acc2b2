# SPDX-License-Identifier: Apache-2.0
"""validate on libvirt's own test domains: every file libvirt accepts gets no error, except
the few listed below with the reason the error is real.

The domains are read at test time from a libvirt source tree outside the repository
(Debian's ``libvirt`` source package, fetched by ``scripts/setup.sh test`` into the test
cache; ``PASSTHROUGH_LIBVIRT_TESTS`` names another ``tests/`` directory). None is copied in.

What libvirt accepts, by its own test suite's files: an input of ``qemuxml2argvtest`` with
an expected command line (``NAME*.args``), an input of ``qemuxml2xmltest`` with an expected
output, and every such output (``qemuxml2xmloutdata``; ``qemuxmlconfdata`` in libvirt 10+).
Inputs that libvirt is expected to refuse (only a ``.err``) are left out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from passthrough.vm.validate import Options, load, validate_file

from .conftest import CACHE

TESTS = os.environ.get("PASSTHROUGH_LIBVIRT_TESTS")
DIRS = ("qemuxml2argvdata", "qemuxml2xmloutdata", "qemuxmlconfdata")

_SCHEMA_INVALID = (
    "libvirt's own schema test (virschematest) expects every *-invalid.xml to fail the "
    "RelaxNG schema: the parser takes it, `virsh define --validate` refuses it"
)
# (file, code) → why the error is real. Exact: a new error, or one of these going away,
# fails the test.
REAL_ERRORS: dict[tuple[str, str], str] = {
    ("qemuxml2argvdata/disk-cdrom-empty-network-invalid.xml", "schema"): _SCHEMA_INVALID,
    ("qemuxml2argvdata/numatune-auto-nodeset-invalid.xml", "schema"): _SCHEMA_INVALID,
    ("qemuxml2argvdata/pci-rom-disabled-invalid.xml", "schema"): _SCHEMA_INVALID,
    ("qemuxml2xmloutdata/pci-rom-disabled-invalid.xml", "schema"): _SCHEMA_INVALID,
}


def libvirt_tests() -> Path:
    if TESTS:
        return Path(TESTS)
    found = sorted((CACHE / "libvirt-src").glob("libvirt-*/tests"))
    if not found:
        pytest.fail(
            f"no libvirt test domains under {CACHE / 'libvirt-src'}: run `scripts/setup.sh "
            "test` (it fetches Debian's libvirt source package) or set PASSTHROUGH_LIBVIRT_TESTS"
        )
    return found[-1]


def accepted_files(tests: Path) -> list[Path]:
    """The domain files of libvirt's QEMU tests that libvirt accepts (module docstring)."""
    files: list[Path] = []
    outputs = tests / "qemuxml2xmloutdata"
    output_names = [p.name for p in outputs.glob("*.xml")] if outputs.is_dir() else []
    for name in DIRS:
        folder = tests / name
        if not folder.is_dir():
            continue
        siblings = os.listdir(folder)
        for path in sorted(folder.glob("*.xml")):
            stem = path.name[: -len(".xml")]
            if name == "qemuxml2xmloutdata":
                files.append(path)
                continue
            args = any(n.startswith(f"{stem}.") and n.endswith(".args") for n in siblings)
            out = any(n == path.name or n.startswith(f"{stem}.") for n in output_names)
            confout = any(n.startswith(f"{stem}.") and n.endswith(".xml") for n in siblings)
            if args or out or (name == "qemuxmlconfdata" and confout):
                files.append(path)
    return files


def test_libvirts_own_test_domains_get_no_false_error() -> None:
    tests = libvirt_tests()
    files = accepted_files(tests)
    opts = Options(schema=load(None))
    errors: dict[tuple[str, str], str] = {}
    with_hostdevs = 0
    for path in files:
        text = path.read_bytes()
        with_hostdevs += b"<hostdev" in text and b"type='pci'" in text
        for f in validate_file(str(path), opts):
            if str(f.severity) == "error":
                errors[(f"{path.parent.name}/{path.name}", f.code)] = f.message
    print(f"libvirt test domains checked: {len(files)} ({with_hostdevs} with PCI hostdevs)")
    assert len(files) > 1000, f"only {len(files)} accepted files under {tests}"
    assert with_hostdevs > 50
    unexplained = {k: v for k, v in errors.items() if k not in REAL_ERRORS}
    assert unexplained == {}
    assert set(errors) == set(REAL_ERRORS), "a listed real error is no longer reported"


def test_the_corpus_holds_the_shapes_this_project_got_wrong() -> None:
    """The files the issue names are among those checked (decimal bus, PCI serial console,
    multifunction left to libvirt)."""
    names = {p.name for p in accepted_files(libvirt_tests())}
    assert {
        "hostdev-vfio-multidomain.xml",
        "pci-serial-dev-chardev.xml",
        "q35-multifunction.xml",
    } <= names
