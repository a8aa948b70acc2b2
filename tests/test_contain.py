# SPDX-License-Identifier: Apache-2.0
"""The one containment walk (plugins/module_utils/passthrough_guest/contain.py, linked as
passthrough/guest/contain.py): the host's root reader and the guest checks' root reader
resolve every path of a hostile tree to the same place inside the root, and stop a link loop
at the same count. Real files and links in a temporary directory."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from passthrough.guest import contain
from passthrough.guest.root import GuestRoot
from passthrough.host.root import HostRoot

REPO = Path(__file__).parents[1]
GUEST_UTILS = REPO / "playbooks/ansible_collections/passthrough/gpu/plugins/module_utils"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("inside\n")
    (root / "sys/devices/pci0000:00/0000:00:01.0").mkdir(parents=True)
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(
        "../../../devices/pci0000:00/0000:00:01.0", root / "sys/bus/pci/devices/0000:00:01.0"
    )
    os.symlink("/etc/hostname", root / "absolute")  # starts again at the root, not at /
    os.symlink("../../../../../../etc/hostname", root / "climbing")  # .. stops at the root
    os.symlink("/", root / "top")
    os.symlink("loop-b", root / "loop-a")
    os.symlink("loop-a", root / "loop-b")
    os.symlink("absolute", root / "chain")
    (tmp_path / "outside").write_text("outside\n")
    os.symlink(str(tmp_path / "outside"), root / "out")  # names a file outside the root
    return root


PATHS = [
    "etc/hostname",
    "absolute",
    "climbing",
    "chain",
    "top/top/etc/hostname",
    "../../etc/hostname",
    "sys/bus/pci/devices/0000:00:01.0",
    "sys/bus/pci/devices/0000:00:01.0/../../../bus",
    "out",
    "missing/../etc/hostname",
]


@pytest.mark.parametrize("rel", PATHS)
def test_host_and_guest_resolve_alike_and_stay_inside(tree: Path, rel: str) -> None:
    host, guest = HostRoot(str(tree)), GuestRoot(str(tree))
    for follow in (True, False):
        assert host.real(rel, follow) == guest.real(rel, follow)
        resolved = Path(guest.real(rel, follow))
        assert resolved == tree or tree in resolved.parents  # never outside the root


def test_what_the_walk_finds(tree: Path) -> None:
    guest = GuestRoot(str(tree))
    for rel in ("absolute", "climbing", "chain", "top/top/etc/hostname"):
        assert guest.read(rel) == "inside"
    assert guest.read("out") is None  # the outside file's name, looked up inside: not there
    assert HostRoot(str(tree)).read("climbing") == "inside"


def test_a_link_loop_fails_with_eloop_on_both_sides(tree: Path) -> None:
    with pytest.raises(OSError) as host_error:
        HostRoot(str(tree)).real("loop-a")
    with pytest.raises(OSError) as guest_error:
        GuestRoot(str(tree)).real("loop-a")
    assert host_error.value.errno == guest_error.value.errno == errno.ELOOP


def test_the_walk_counts_links_up_to_the_kernels_limit(tmp_path: Path) -> None:
    for i in range(contain.MAX_LINK_HOPS + 1):
        os.symlink(f"l{i + 1}", tmp_path / f"l{i}")
    (tmp_path / f"l{contain.MAX_LINK_HOPS + 1}").write_text("end")
    base = str(tmp_path)
    here, complete, hops = contain.resolve(base, contain.parts("l1"), name="l1")
    assert (here, complete, hops) == (f"l{contain.MAX_LINK_HOPS + 1}", True, 40)
    with pytest.raises(OSError) as error:
        contain.resolve(base, contain.parts("l0"), name="l0")
    assert error.value.errno == errno.ELOOP and error.value.filename == "l0"


def test_one_file_in_the_collection_the_package_links_to() -> None:
    source = GUEST_UTILS / "passthrough_guest/contain.py"
    assert not source.is_symlink()
    link = REPO / "passthrough/guest/contain.py"
    assert link.is_symlink() and link.resolve() == source.resolve()
    # standard library only: it runs in guests without the package
    text = source.read_text()
    assert "import passthrough" not in text and "from passthrough" not in text
