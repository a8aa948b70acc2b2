# SPDX-License-Identifier: Apache-2.0
"""Verdicts and reasons for each modelled host: what an experienced user would conclude."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from passthrough.analysis.scan import analyse
from passthrough.host.discover import discover
from passthrough.output.json import scan_json


def _gpus(root: Path) -> dict[str, dict[str, Any]]:
    return {g["address"]: g for g in scan_json(analyse(discover(str(root))))["gpus"]}


def _has(items: list[str], *needles: str) -> bool:
    return any(all(n in item for n in needles) for item in items)


def _named(gpu: dict[str, Any], code: str) -> set[str]:
    """The devices the findings with ``code`` name (empty: no such finding)."""
    return {d for f in gpu["findings"] if f["code"] == code for d in f["devices"]}


def _codes(gpu: dict[str, Any], severity: str) -> set[str]:
    return {f["code"] for f in gpu["findings"] if f["severity"] == severity}


def test_consumer_intel_gpu_on_cpu_lanes_is_viable(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["consumer-intel"])
    rtx = gpus["0000:01:00.0"]
    assert rtx["viable"] is True
    assert rtx["reasons"] == []
    assert rtx["functions"] == ["0000:01:00.0", "0000:01:00.1"]
    # the root port shares the group; bridges do not spoil viability
    assert rtx["group_members"] == ["0000:00:01.0", "0000:01:00.0", "0000:01:00.1"]
    assert rtx["vfio_ids"] == ["10de:2684", "10de:22ba"]
    assert rtx["id"] == "10de:2684" and rtx["class"] == "0x030000"
    assert rtx["iommu_group"] == 1 and rtx["driver"] == "nvidia" and rtx["boot_vga"] is False
    assert {b["index"]: b["size"] for b in rtx["bars"]} == {0: 16 << 20, 1: 32 << 30, 3: 32 << 20}
    assert _has(rtx["warnings"], "BAR1 is 32 GiB", "64 GiB")
    igpu = gpus["0000:00:02.0"]
    assert igpu["boot_vga"] is True
    assert {"boot-gpu", "intel-igpu"} <= _codes(igpu, "warning")
    assert _has(igpu["warnings"], "initcall_blacklist=sysfb_init")


def test_b550_chipset_gpu_shares_group_with_usb_sata_and_the_route_nic(
    hosts: dict[str, Path],
) -> None:
    gpus = _gpus(hosts["amd-b550-chipset"])
    cpu_lanes = gpus["0000:2d:00.0"]
    assert cpu_lanes["viable"] is True
    chipset = gpus["0000:2b:00.0"]
    assert chipset["viable"] is False
    assert _named(chipset, "group-shared") >= {"0000:22:00.0", "0000:22:00.1", "0000:2a:00.0"}
    assert _named(chipset, "route-nic-in-group") == {"0000:2a:00.0"}
    assert _codes(chipset, "error") == {"group-shared", "route-nic-in-group"}
    # bridges in the group are not named as obstacles
    assert not any("0000:21:08.0" in f["devices"] for f in chipset["findings"])


def test_two_gpus_in_one_group_name_each_other(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["two-gpus-one-group"])
    first, second = gpus["0000:01:00.0"], gpus["0000:02:00.0"]
    assert not first["viable"] and not second["viable"]
    assert _named(first, "group-other-gpu") == {"0000:02:00.0"}
    assert _has(first["reasons"], "0000:02:00.0", "0000:02:00.3")  # the card told whole
    assert _named(second, "group-other-gpu") == {"0000:01:00.0"}
    assert _has(second["reasons"], "0000:01:00.0", "0000:01:00.1")
    # the Turing card keeps its four functions together
    assert second["functions"] == ["0000:02:00.0", "0000:02:00.1", "0000:02:00.2", "0000:02:00.3"]
    assert second["vfio_ids"] == ["10de:1e84", "10de:10f8", "10de:1ad8", "10de:1ad9"]


def test_acs_override_is_flagged_even_when_groups_look_clean(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["acs-override-proxmox"])
    rtx = gpus["0000:24:00.0"]
    assert rtx["viable"] is True
    assert _has(rtx["warnings"], "pcie_acs_override", "synthetic", "not real")
    assert {"acs-override", "vfio-bound"} <= _codes(rtx, "warning") | _codes(rtx, "info")
    apu = gpus["0000:30:00.0"]
    assert "no-reset" in _codes(apu, "warning")


def test_epyc_v100_pairs_behind_plx_switch_share_groups(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["epyc-v100"])
    for a, b in (("03", "04"), ("04", "03"), ("07", "08"), ("08", "07")):
        v = gpus[f"0000:{a}:00.0"]
        assert not v["viable"]
        assert _named(v, "group-other-gpu") == {f"0000:{b}:00.0"}
        assert v["numa_node"] == 0
        assert v["parents"][-1].startswith("0000:")  # behind the switch's downstream port
    bmc = gpus["0000:64:00.0"]
    assert not bmc["viable"]
    assert _codes(bmc, "error") == {"bmc-vga"}
    assert _has(bmc["reasons"], "ASPEED")


def test_hgx_h100_every_gpu_viable_with_large_bar_and_numa(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["hgx-h100"])
    h100 = {a: g for a, g in gpus.items() if g["id"] == "10de:2330"}
    assert len(h100) == 8
    assert {g["numa_node"] for g in h100.values()} == {0, 1}
    for g in h100.values():
        assert g["viable"], g["reasons"]
        assert max(b["size"] for b in g["bars"]) == 128 << 30
        assert _has(g["warnings"], "BAR2 is 128 GiB", "256 GiB")
        assert {"large-bar", "nvswitch"} <= _codes(g, "warning")
        assert len(g["parents"]) == 3  # root port → switch upstream → switch downstream
    assert gpus["0000:02:00.0"]["viable"] is False  # the BMC console


def test_optimus_laptop_3d_controller(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["optimus-laptop"])
    dgpu = gpus["0000:01:00.0"]
    assert dgpu["class"] == "0x030200"
    assert dgpu["viable"] is True
    assert "laptop-3d" in _codes(dgpu, "warning")


def test_bmc_only_server_has_no_candidate(hosts: dict[str, Path]) -> None:
    scan = scan_json(analyse(discover(str(hosts["bmc-only-server"]))))
    assert [g["viable"] for g in scan["gpus"]] == [False]
    gpu_check = next(c for c in scan["checks"] if c["id"] == "gpu-viable")
    assert gpu_check["level"] == "FAIL" and "no GPU" in gpu_check["summary"]


def test_iommu_off_means_no_group_and_not_viable(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["iommu-off"])
    g = gpus["0000:01:00.0"]
    assert g["iommu_group"] is None and g["group_members"] == []
    assert not g["viable"]
    assert _codes(g, "error") == {"no-iommu"}
    assert "only-gpu" in _codes(g, "warning")


def test_group_with_root_nvme_is_a_hard_refusal(hosts: dict[str, Path]) -> None:
    gpus = _gpus(hosts["root-nvme-in-group"])
    g = gpus["0000:05:00.0"]
    assert not g["viable"]
    assert _named(g, "root-disk-in-group") == {"0000:04:00.0"}
    assert _has(g["reasons"], "/dev/nvme0n1p2")
    assert gpus["0000:0a:00.0"]["viable"] is True


@pytest.mark.parametrize(
    ("name", "bootloader", "initramfs"),
    [
        ("consumer-intel", "grub", "initramfs-tools"),
        ("amd-b550-chipset", "grub", "initramfs-tools"),
        ("two-gpus-one-group", "grubby", "dracut"),
        ("acs-override-proxmox", "proxmox-boot-tool", "initramfs-tools"),
        ("epyc-v100", "grubby", "dracut"),
        ("root-nvme-in-group", "systemd-boot", "mkinitcpio"),
    ],
)
def test_bootloader_and_initramfs_detected(
    name: str, bootloader: str, initramfs: str, hosts: dict[str, Path]
) -> None:
    host = discover(str(hosts[name]))
    assert host.boot.bootloader.value == bootloader
    assert host.boot.initramfs.value == initramfs
    assert host.boot.bootloader_evidence


def test_critical_devices_through_lvm_and_bridge(hosts: dict[str, Path]) -> None:
    host = discover(str(hosts["acs-override-proxmox"]))
    assert [str(a) for a in host.critical.root_pci] == ["0000:01:00.0"]  # dm-0 → nvme0n1p2
    assert host.critical.default_nic == "vmbr0"
    assert [str(a) for a in host.critical.nic_pci] == ["0000:25:00.0"]  # vmbr0 → enp37s0
