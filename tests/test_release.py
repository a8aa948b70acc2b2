# SPDX-License-Identifier: Apache-2.0
"""``passthrough release`` on sample roots: a card a guest holds is refused with the holder
named, other roots are refused before anything is written, nothing to do is said, and a
damaged live-driver journal is one line. The moves themselves, with the kernel's bind
events, are in tests/test_bind.py (umockdev)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from passthrough.live.livedrivers import LIVE

from .cli_process import run_cli
from .conftest import build_variant
from .test_json_schemas import valid

GPU = "0000:24:00.0"  # acs-override-proxmox: the RTX 3060 and its audio on vfio-pci
QEMU_CGROUP = "0::/machine.slice/machine-qemu\\x2d1\\x2dwin11.scope/libvirt/emulator\n"


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _guest_holding(root: Path, node: str, pid: int = 4242) -> None:
    """A QEMU process with ``node`` open, as /proc shows one."""
    proc = root / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True)
    (proc / "comm").write_text("qemu-system-x86\n")
    (proc / "cgroup").write_text(QEMU_CGROUP)
    (proc / "fd" / "31").symlink_to(node)


@pytest.fixture
def on_vfio(tmp_path: Path) -> Path:
    return build_variant(tmp_path, "acs-override-proxmox", iommufd={"vfio_dev": True})


def test_a_guest_holding_the_group_is_named_and_nothing_changes(on_vfio: Path) -> None:
    group = os.readlink(on_vfio / f"sys/bus/pci/devices/{GPU}/iommu_group").rsplit("/", 1)[1]
    _guest_holding(on_vfio, f"/dev/vfio/{group}")
    before = _tree_hash(on_vfio)
    r = run_cli(["release", "--root", str(on_vfio), "--gpu", GPU, "--yes"])
    assert r.returncode == 2
    assert r.stderr == (
        f"passthrough: error: {GPU}, 0000:24:00.1: held open, not released: "
        "qemu-system-x86 (pid 4242) "
        f"holds /dev/vfio/{group}; shut the guest down first (virsh shutdown; else end "
        "qemu-system-x86 (pid 4242)), then release\n"
    )
    assert _tree_hash(on_vfio) == before


def test_a_guest_holding_the_cdev_is_named(on_vfio: Path) -> None:
    _guest_holding(on_vfio, "/dev/vfio/devices/vfio1")  # the audio function's cdev
    r = run_cli(["release", "--root", str(on_vfio), "--gpu", GPU, "--yes"])
    assert r.returncode == 2
    assert (
        "error: 0000:24:00.1: held open" in r.stderr and "holds /dev/vfio/devices/vfio1" in r.stderr
    )


def test_another_root_is_refused_before_anything_is_written(on_vfio: Path) -> None:
    before = _tree_hash(on_vfio)
    r = run_cli(["release", "--root", str(on_vfio), "--gpu", GPU])
    assert r.returncode == 2
    assert r.stderr == "passthrough: error: releasing now works on the live host only (--root /)\n"
    assert _tree_hash(on_vfio) == before


def test_nothing_on_vfio_is_nothing_to_do(hosts: dict[str, Path]) -> None:
    r = run_cli(["release", "--root", str(hosts["consumer-intel"]), "--json"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert valid(out) == "release"
    assert out["released"] == {} and out["planned"] == {} and out["left_on_vfio"] == []
    assert out["functions"] == ["0000:01:00.0", "0000:01:00.1"]
    r = run_cli(["release", "--root", str(hosts["consumer-intel"])])
    assert r.stdout == "No function of these cards is on a vfio driver: nothing to do.\n"
    # a host without an NVIDIA card: nothing to give back either (not "no viable GPU")
    r = run_cli(["release", "--root", str(hosts["bmc-only-server"])])
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stderr


def test_a_damaged_live_journal_is_one_line(on_vfio: Path) -> None:
    journal = on_vfio / LIVE
    journal.parent.mkdir(parents=True)
    journal.write_text("{not json")
    r = run_cli(["release", "--root", str(on_vfio), "--gpu", GPU, "--yes"])
    assert r.returncode == 2
    assert r.stderr.startswith(f"passthrough: error: {journal}: not the live-driver journal")
    assert len(r.stderr.splitlines()) == 1


# -- the Ansible module that moves drivers live (passthrough_live_driver), run as Ansible runs it


def _module(tmp_path: Path, **args: object) -> dict[str, object]:
    from .test_options_ansible import _run_module

    return _run_module(tmp_path, "passthrough_live_driver", **args)


def test_module_check_mode_says_what_would_move_and_moves_nothing(
    on_vfio: Path, hosts: dict[str, Path], tmp_path: Path
) -> None:
    before = _tree_hash(on_vfio)
    out = _module(tmp_path, root=str(on_vfio), state="host", _ansible_check_mode=True)
    assert out["changed"] is True and out["moved"] == {}
    assert out["planned"] == {GPU: None, "0000:24:00.1": None}  # the kernel's default
    assert _tree_hash(on_vfio) == before
    out = _module(
        tmp_path, root=str(hosts["consumer-intel"]), state="vfio", _ansible_check_mode=True
    )
    assert out["planned"] == {"0000:01:00.0": "vfio-pci", "0000:01:00.1": "vfio-pci"}
    out = _module(tmp_path, root=str(hosts["consumer-intel"]), state="host")
    assert out["changed"] is False and out["planned"] == {}


def test_module_refuses_as_the_command_does(on_vfio: Path, tmp_path: Path) -> None:
    out = _module(tmp_path, root=str(on_vfio), state="host")
    assert out["failed"] is True
    assert out["msg"] == "releasing now works on the live host only (--root /)"
    _guest_holding(on_vfio, "/dev/vfio/devices/vfio0")
    out = _module(tmp_path, root=str(on_vfio), state="host", gpus=[GPU])
    assert out["failed"] is True and "qemu-system-x86 (pid 4242) holds" in str(out["msg"])
