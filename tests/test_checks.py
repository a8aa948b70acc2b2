# SPDX-License-Identifier: Apache-2.0
"""Readiness checks and host facts on variants of the sample hosts."""

from __future__ import annotations

from pathlib import Path

from passthrough.analysis.scan import analyse
from passthrough.host.discover import discover
from passthrough.model import Level

from .conftest import build_variant


def _checks(root: Path) -> dict[str, tuple[Level, str, str | None]]:
    return {c.id: (c.level, c.summary, c.fix) for c in analyse(discover(str(root))).checks}


def test_amd_iommu_on_is_flagged_as_invalid(tmp_path: Path) -> None:
    root = build_variant(
        tmp_path,
        "amd-b550-chipset",
        kernel={"cmdline": "root=/dev/nvme0n1p2 ro amd_iommu=on iommu=pt"},
    )
    level, summary, fix = _checks(root)["kernel-iommu-args"]
    assert level is Level.WARN
    assert (
        "not a valid value" in summary and fix == "remove amd_iommu=on from the kernel command line"
    )


def test_intel_default_on_kernel_needs_no_argument(tmp_path: Path) -> None:
    root = build_variant(tmp_path, "hgx-h100")  # Ubuntu 24.04: CONFIG_INTEL_IOMMU_DEFAULT_ON=y
    level, summary, _ = _checks(root)["kernel-iommu-args"]
    assert level is Level.PASS and "CONFIG_INTEL_IOMMU_DEFAULT_ON=y" in summary


def test_intel_iommu_off_on_cmdline_fails_with_the_fix(tmp_path: Path) -> None:
    root = build_variant(
        tmp_path,
        "consumer-intel",
        kernel={"cmdline": "root=/dev/nvme0n1p2 ro intel_iommu=off"},
        iommu={"enabled": False},
    )
    checks = _checks(root)
    assert checks["iommu-enabled"][0] is Level.FAIL
    assert checks["iommu-enabled"][2] == "remove intel_iommu=off from the kernel command line"
    assert checks["kernel-iommu-args"][0] is Level.FAIL


def test_no_interrupt_remapping_fails_and_unsafe_override_warns(tmp_path: Path) -> None:
    root = build_variant(tmp_path, "consumer-intel", iommu={"intremap": False})
    level, summary, fix = _checks(root)["interrupt-remapping"]
    assert (
        level is Level.FAIL
        and "VFIO refuses" in summary
        and fix
        and "allow_unsafe_interrupts" in fix
    )
    param = root / "sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts"
    param.parent.mkdir(parents=True)
    param.write_text("Y\n")
    level, summary, _ = _checks(root)["interrupt-remapping"]
    assert level is Level.WARN and "allow_unsafe_interrupts=1" in summary


def test_no_virtualization_no_kvm_no_vfio(tmp_path: Path) -> None:
    root = build_variant(
        tmp_path,
        "consumer-intel",
        cpu={"vendor": "intel", "virt": False},
        kvm=False,
        kernel={"vfio": "none", "config": {"CONFIG_VFIO_PCI": "n"}},
    )
    checks = _checks(root)
    assert checks["cpu-virtualization"][0] is Level.FAIL
    assert checks["kvm-device"] == (
        Level.FAIL,
        "/dev/kvm missing",
        "load kvm_intel (modprobe kvm_intel)",
    )
    assert checks["vfio-modules"][0] is Level.FAIL


def test_builtin_vfio_and_missing_kernel_config(tmp_path: Path) -> None:
    root = build_variant(tmp_path, "consumer-intel", kernel={"vfio": "builtin"})
    for config in root.glob("boot/config-*"):
        config.unlink()
    host = discover(str(root))
    assert host.kernel.vfio_pci == "builtin"
    assert host.kernel.config == {} and host.kernel.config_source is None
    # no argument and no config: the kernel's default cannot be known, and we say so
    level, summary, _ = _checks(root)["kernel-iommu-args"]
    assert level is Level.WARN and "kernel default unknown" in summary
    cmdline = root / "proc/cmdline"
    cmdline.write_text(cmdline.read_text().strip() + " intel_iommu=on\n")
    assert _checks(root)["kernel-iommu-args"][0] is Level.PASS


def test_unknown_bootloader_warns(tmp_path: Path) -> None:
    root = build_variant(
        tmp_path, "consumer-intel", boot={"bootloader": "none", "initramfs": "none"}
    )
    level, summary, _ = _checks(root)["bootloader"]
    assert level is Level.WARN and "not recognised" in summary


def test_rpm_ostree_and_kernelstub_are_detected(tmp_path: Path) -> None:
    silverblue = build_variant(tmp_path / "a", "optimus-laptop", boot={"bootloader": "rpm-ostree"})
    assert discover(str(silverblue)).boot.bootloader.value == "rpm-ostree"
    pop = build_variant(tmp_path / "b", "consumer-intel", distro="popos-22.04")
    host = discover(str(pop))
    assert host.boot.bootloader.value == "kernelstub"
    assert host.distro.id == "pop" and host.distro.id_like == ("ubuntu", "debian")


def test_bios_host(hosts: dict[str, Path]) -> None:
    host = discover(str(hosts["bmc-only-server"]))
    assert host.boot.uefi is False
    assert host.critical.root_device == "/dev/sda2"
    assert [str(a) for a in host.critical.root_pci] == ["0000:00:17.0"]
