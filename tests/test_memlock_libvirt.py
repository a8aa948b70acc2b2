# SPDX-License-Identifier: Apache-2.0
"""The memlock estimate against libvirt's own test of the rule it follows.

libvirt's ``tests/qemumemlocktest.c`` checks ``qemuDomainGetMemLockLimitBytes`` on the
domains of ``tests/qemumemlockdata``: each ``DO_TEST("name", bytes)`` line names a domain
and the limit libvirt sets for it. Both are read at test time from the libvirt source tree
in the test cache (``scripts/setup.sh test``), none is copied in; the expected values come
from the C file itself, so a libvirt release with other cases is checked as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lxml import etree

from passthrough.vm.memlock import libvirt_limit

from .test_libvirt_corpus import libvirt_tests

pytestmark = pytest.mark.realworld

# DO_TEST("pc-hostdev", 2147483648); the unlimited value by its C name
_DO_TEST = re.compile(r'^\s*DO_TEST\("([^"]+)",\s*([A-Z_]+|\d+)\);', re.MULTILINE)
UNLIMITED = "VIR_DOMAIN_MEMORY_PARAM_UNLIMITED"


def cases(tests: Path) -> list[tuple[str, int | None]]:
    source = tests / "qemumemlocktest.c"
    if not source.is_file():
        pytest.fail(f"no {source}: run `scripts/setup.sh test` (it extracts tests/qemumemlock*)")
    text = source.read_text()
    return [(n, None if v == UNLIMITED else int(v)) for n, v in _DO_TEST.findall(text)]


def test_every_domain_of_libvirts_memlock_test_gets_libvirts_value() -> None:
    tests = libvirt_tests()
    found = cases(tests)
    # libvirt 9.0 has 18 cases (x86_64 pc and ppc64 pseries, each with and without a hard
    # limit, <locked/> and a hostdev); a parser that finds none must not pass
    assert len(found) >= 18
    data = tests / "qemumemlockdata"
    assert {f"qemumemlock-{n}.xml" for n, _ in found} == {p.name for p in data.glob("*.xml")}
    wrong = []
    for name, expected in found:
        doc = etree.parse(str(data / f"qemumemlock-{name}.xml")).getroot()
        got = libvirt_limit(doc).limit
        if got != expected:
            wrong.append(f"{name}: libvirt {expected}, ours {got}")
    assert wrong == []
