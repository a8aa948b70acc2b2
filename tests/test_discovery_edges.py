# SPDX-License-Identifier: Apache-2.0
"""What a GPU is, where the hardware says so: SR-IOV virtual functions (their ``physfn``
link) and a display function the IOMMU isolates on the card's own slot. Real trees built by
fakehost from minimal descriptions of shapes seen on real hosts (a FirePro/MxGPU host with
each VF in its own IOMMU group)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from passthrough import fakehost
from passthrough.analysis.codes import SRIOV_VF
from passthrough.analysis.policy import judge_all
from passthrough.analysis.viability import find_gpus
from passthrough.host.discover import discover
from passthrough.model import PciAddress

_BRIDGE = {"id": "8086:1901", "class": "bridge"}


def _host(tmp_path: Path, pci: list[dict[str, Any]]) -> Path:
    data = {"description": "a test shape", "vendors": {"1002": "AMD", "10de": "NVIDIA"}}
    data["pci"] = [{"addr": "00:00.0", "id": "8086:3e30", "class": "host-bridge"}, *pci]
    return fakehost.build(fakehost.Description(data, "shape"), tmp_path / "root")


def _cards(root: Path) -> dict[str, list[str]]:
    return {
        str(g.address): [str(f.address) for f in g.functions]
        for g in find_gpus(discover(str(root)))
    }


def _mxgpu(tmp_path: Path) -> Path:
    """A FirePro S7150-style card: the PF at 0b:00.0 (with its audio), three VFs on slot
    0c:02, each VF alone in its IOMMU group."""
    vf = {"id": "1002:692f", "class": "0x038000", "physfn": "0000:0b:00.0", "driver": None}
    return _host(
        tmp_path,
        [
            {**_BRIDGE, "addr": "00:01.0", "group": 1, "children": [
                {"addr": "0b:00.0", "id": "1002:6929", "class": "vga", "sriov_totalvfs": 16},
                {"addr": "0b:00.1", "id": "1002:aac8", "class": "audio"},
            ]},
            {**_BRIDGE, "addr": "00:02.0", "group": 2, "children": [
                {**vf, "addr": "0c:02.0", "group": 21},
                {**vf, "addr": "0c:02.1", "group": 22},
                {**vf, "addr": "0c:02.2", "group": 23},
            ]},
        ],
    )  # fmt: skip


def test_sriov_virtual_functions_are_gpus_of_their_own(tmp_path: Path) -> None:
    cards = _cards(_mxgpu(tmp_path))
    assert cards == {
        "0000:0b:00.0": ["0000:0b:00.0", "0000:0b:00.1"],
        "0000:0c:02.0": ["0000:0c:02.0"],
        "0000:0c:02.1": ["0000:0c:02.1"],
        "0000:0c:02.2": ["0000:0c:02.2"],
    }


def test_each_virtual_function_names_its_physical_function(tmp_path: Path) -> None:
    verdicts = {str(v.gpu.address): v for v in judge_all(discover(str(_mxgpu(tmp_path))))}
    for vf in ("0000:0c:02.0", "0000:0c:02.1", "0000:0c:02.2"):
        found = [f for f in verdicts[vf].findings if f.code == SRIOV_VF]
        assert len(found) == 1 and "0000:0b:00.0" in found[0].message
        assert verdicts[vf].viable  # its own group: nothing else goes with it
        assert verdicts[vf].gpu.primary.physfn == PciAddress.parse("0000:0b:00.0")
    assert SRIOV_VF not in verdicts["0000:0b:00.0"].codes


def test_a_display_function_in_another_group_is_its_own_gpu(tmp_path: Path) -> None:
    """Two display functions on one slot that the IOMMU separates: each can go to its own
    guest; the audio in the first one's group stays with it."""
    root = _host(
        tmp_path,
        [
            {**_BRIDGE, "addr": "00:01.0", "children": [
                {"addr": "03:00.0", "id": "10de:1eb8", "class": "3d", "group": 5},
                {"addr": "03:00.1", "id": "10de:10f8", "class": "audio", "group": 5},
                {"addr": "03:00.2", "id": "10de:1eb8", "class": "3d", "group": 6},
            ]},
        ],
    )  # fmt: skip
    assert _cards(root) == {
        "0000:03:00.0": ["0000:03:00.0", "0000:03:00.1"],
        "0000:03:00.2": ["0000:03:00.2"],
    }


def test_display_functions_in_one_group_stay_one_card(tmp_path: Path) -> None:
    """The control: the same slot with one group is one card (a dual-GPU board's second
    display function goes with the first, as before)."""
    root = _host(
        tmp_path,
        [
            {**_BRIDGE, "addr": "00:01.0", "group": 5, "group_children": True, "children": [
                {"addr": "03:00.0", "id": "10de:1eb8", "class": "vga"},
                {"addr": "03:00.1", "id": "10de:1eb8", "class": "3d"},
            ]},
        ],
    )  # fmt: skip
    assert _cards(root) == {"0000:03:00.0": ["0000:03:00.0", "0000:03:00.1"]}


def test_a_virtual_function_is_taken_only_when_named(tmp_path: Path) -> None:
    """An A100-style PF with two VFs (each in its own group): plan and render take the PF
    by default; a VF named with --gpu is a card of its own."""
    from passthrough.analysis.scan import analyse
    from passthrough.plan.select import select
    from passthrough.vm.spec import VmOptions, build_spec

    vf = {"id": "10de:20b0", "class": "3d", "physfn": "0000:41:00.0", "driver": None}
    root = _host(
        tmp_path,
        [
            {**_BRIDGE, "addr": "00:03.0", "children": [
                {"addr": "41:00.0", "id": "10de:20b0", "class": "3d", "group": 30,
                 "sriov_totalvfs": 16},
                {**vf, "addr": "41:00.4", "group": 31},
                {**vf, "addr": "41:00.5", "group": 32},
            ]},
        ],
    )  # fmt: skip
    host = discover(str(root))
    verdicts = analyse(host).verdicts
    assert [str(f.address) for f in select(host, verdicts, []).functions] == ["0000:41:00.0"]
    spec = build_spec(host, VmOptions(name="pf", memory_mib=4096))
    assert [str(f.host) for c in spec.cards for f in c.functions] == ["0000:41:00.0"]
    named = build_spec(host, VmOptions(name="vf", gpus=("41:00.5",), memory_mib=4096))
    assert [str(f.host) for c in named.cards for f in c.functions] == ["0000:41:00.5"]
    assert any(w.endswith("[sriov-vf]") for w in named.warnings)
