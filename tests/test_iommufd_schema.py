# SPDX-License-Identifier: Apache-2.0
"""`render --iommufd` against the RelaxNG schemas of a libvirt that knows the form: Debian
sid's libvirt-common (12.1 or later), which `scripts/setup.sh test` fetches into the test
cache. Checked with virt-xml-validate's engine (``xmllint --relaxng`` on domain.rng), and
with `validate --schema-dir`; a document with the attribute misspelt, misplaced or given a
wrong value must be refused by the same schema. libvirt 12.1's exact source could not be
fetched here (snapshot.debian.org and download.libvirt.org do not answer this machine)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .cli_process import run_cli
from .conftest import CACHE, GOLDEN
from .test_iommufd import ready, rendered

pytestmark = pytest.mark.realworld
__all__ = ["ready", "rendered"]  # the fixtures this module shares with tests/test_iommufd.py

FETCHED = CACHE / "libvirt-schemas"


@pytest.fixture(scope="module")
def schemas() -> Path:
    found = FETCHED / "usr/share/libvirt/schemas"
    if not (found / "domain.rng").is_file():
        pytest.fail(f"no libvirt schemas under {FETCHED}: run `scripts/setup.sh test`")
    return found


def _version() -> tuple[int, int]:
    debs = sorted(FETCHED.glob("libvirt-common_*.deb"))
    assert len(debs) == 1, debs
    m = re.match(r"libvirt-common_(\d+)\.(\d+)", debs[0].name)
    assert m, debs[0].name
    return int(m[1]), int(m[2])


def _xmllint(schemas: Path, doc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["xmllint", "--noout", "--relaxng", str(schemas / "domain.rng"), str(doc)],
        capture_output=True,
        text=True,
    )


def test_the_fetched_libvirt_knows_the_form(schemas: Path) -> None:
    assert _version() >= (12, 1)
    # the attribute on a hostdev's <driver>, yes or no, as the schema defines it
    text = (schemas / "basictypes.rng").read_text()
    driver = re.search(r'<define name="hostdevDriver">.*?</define>', text, re.S)
    assert driver and '<attribute name="iommufd">' in driver[0] and "virYesNo" in driver[0]


def test_golden_and_rendered_domains_validate(schemas: Path, rendered: Path) -> None:
    golden = GOLDEN / "vm" / "iommufd-ready.xml"
    for doc in (golden, rendered):
        r = _xmllint(schemas, doc)
        assert r.returncode == 0 and "validates" in r.stderr, r.stderr
    rc = run_cli(["validate", "--schema-dir", str(schemas), str(rendered)])
    assert rc.returncode == 0 and "schema-iommufd" not in rc.stdout, rc.stdout
    # the schema this machine's libvirt 9.0 ships refuses the same document
    assert _xmllint(Path("/usr/share/libvirt/schemas"), rendered).returncode != 0


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("iommufd='yes'", "iommufd='maybe'"),  # a value the schema does not allow
        ("iommufd='yes'", "iommu='yes'"),  # a misspelt attribute
        # the attribute on <source> instead of <driver>
        (
            "<driver name='vfio' iommufd='yes'/>\n      <source>",
            "<driver name='vfio'/>\n      <source iommufd='yes'>",
        ),
    ],
)
def test_a_wrong_form_is_refused(
    schemas: Path, rendered: Path, tmp_path: Path, old: str, new: str
) -> None:
    text = rendered.read_text()
    assert old in text
    mutated = tmp_path / "mutated.xml"
    mutated.write_text(text.replace(old, new))
    r = _xmllint(schemas, mutated)
    assert r.returncode != 0 and "fails to validate" in r.stderr, r.stderr
