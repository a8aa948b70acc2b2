# SPDX-License-Identifier: Apache-2.0
"""Fixture trees are realistic enough for the real lspci (pciutils) to read them.

lspci reads the `config` file of each function through its linux-sysfs back end; what it
reports must agree with what passthrough reads from the attribute files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.host.discover import discover

LSPCI = shutil.which("lspci") or "/usr/bin/lspci"
LINE = re.compile(
    r"^(?P<addr>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .*\[(?P<cls>[0-9a-f]{4})\]: .*"
    r"\[(?P<id>[0-9a-f]{4}:[0-9a-f]{4})\]"
)


@pytest.mark.parametrize("name", fakehost.sample_names())
def test_lspci_reads_the_same_functions(name: str, hosts: dict[str, Path]) -> None:
    root = hosts[name]
    out = subprocess.run(
        [LSPCI, "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-nn", "-D"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seen = {}
    for line in out.splitlines():
        m = LINE.match(line)
        assert m, f"unexpected lspci line: {line!r}"
        seen[m["addr"]] = (m["cls"], m["id"])
    ours = {
        str(f.address): (f"{f.class_code >> 8:04x}", f.id) for f in discover(str(root)).functions
    }
    assert seen == ours
    assert len(seen) >= 9


def test_lspci_sees_the_bridge_tree(hosts: dict[str, Path]) -> None:
    out = subprocess.run(
        [LSPCI, "-A", "linux-sysfs", "-O", f"sysfs.path={hosts['hgx-h100']}/sys/bus/pci", "-t"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # secondary bus numbers in the bridges' config space make lspci draw the switch below
    # its root port, as on the real machine
    assert "[16-1c]" in out or "16-1c" in out, out
