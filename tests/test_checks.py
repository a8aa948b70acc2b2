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


# -- iommufd: each piece present or missing on a variant of a host with a card on vfio-pci --

IOMMUFD_ON = {"CONFIG_IOMMUFD": "y", "CONFIG_VFIO_DEVICE_CDEV": "y"}
NEW_STACK = {"qemu-system-x86": "1:10.0.2+ds-1", "libvirt-daemon": "12.1.0-1"}
PROXMOX_CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro iommu=pt"


def _iommufd(tmp_path: Path, **overrides: object) -> tuple[Level, str, str | None]:
    kernel = {"cmdline": PROXMOX_CMDLINE, "config": IOMMUFD_ON}
    overrides = {"kernel": kernel, "packages": NEW_STACK, **overrides}
    return _checks(build_variant(tmp_path, "acs-override-proxmox", **overrides))["iommufd"]


def test_iommufd_passes_with_every_piece(tmp_path: Path) -> None:
    level, summary, _ = _iommufd(tmp_path, iommufd={"dev_iommu": True, "vfio_dev": True})
    assert level is Level.PASS
    assert summary == (
        "/dev/iommu, 0000:24:00.0 → /dev/vfio/devices/vfio0, 0000:24:00.1 → /dev/vfio/devices/vfio1"
    )


def test_iommufd_module_not_loaded_warns_with_modprobe(tmp_path: Path) -> None:
    kernel = {"cmdline": PROXMOX_CMDLINE, "config": {**IOMMUFD_ON, "CONFIG_IOMMUFD": "m"}}
    level, summary, fix = _iommufd(tmp_path, kernel=kernel, iommufd={"vfio_dev": True})
    assert level is Level.WARN
    assert summary == "/dev/iommu missing: the iommufd module is not loaded"
    assert fix and fix.startswith("modprobe iommufd")


def test_iommufd_built_in_without_dev_iommu_warns(tmp_path: Path) -> None:
    level, summary, _ = _iommufd(tmp_path, iommufd={"module": True, "vfio_dev": True})
    assert level is Level.WARN
    assert summary == "/dev/iommu missing although iommufd is in the kernel"


def test_iommufd_bound_function_without_cdev_is_named(tmp_path: Path) -> None:
    level, summary, fix = _iommufd(tmp_path, iommufd={"dev_iommu": True})
    assert level is Level.WARN
    assert "0000:24:00.0 is bound to vfio-pci but has no vfio-dev/vfioN" in summary
    assert "0000:24:00.1 is bound to vfio-pci but has no vfio-dev/vfioN" in summary
    assert fix and "rebind 0000:24:00.0 to vfio-pci" in fix


def test_iommufd_cdev_without_dev_node_is_named(tmp_path: Path) -> None:
    iommufd = {"dev_iommu": True, "vfio_dev": True, "dev_nodes": False}
    level, summary, _ = _iommufd(tmp_path, iommufd=iommufd)
    assert level is Level.WARN
    assert summary.startswith("0000:24:00.0: /dev/vfio/devices/vfio0 missing")


def test_iommufd_option_off_is_information_naming_it(tmp_path: Path) -> None:
    kernel = {"cmdline": PROXMOX_CMDLINE, "config": {**IOMMUFD_ON, "CONFIG_VFIO_DEVICE_CDEV": "n"}}
    level, summary, fix = _iommufd(tmp_path, kernel=kernel)
    assert level is Level.INFO
    assert summary.startswith("CONFIG_VFIO_DEVICE_CDEV is not set in /boot/config-6.8.12-4-pve")
    assert "CONFIG_IOMMUFD" not in summary
    assert fix and "Linux 6.6+" in fix


def test_iommufd_kernel_too_old(tmp_path: Path) -> None:
    # consumer-intel: Debian 12's 6.1, whose config has neither option
    level, summary, _ = _checks(build_variant(tmp_path, "consumer-intel"))["iommufd"]
    assert level is Level.INFO
    assert "kernel 6.1.0-27-amd64 is too old for CONFIG_IOMMUFD (Linux 6.2+)" in summary
    assert "too old for CONFIG_VFIO_DEVICE_CDEV (Linux 6.6+)" in summary


def test_iommufd_ready_kernel_with_old_qemu_and_libvirt(tmp_path: Path) -> None:
    old = {"qemu-system-x86": "1:7.2+dfsg-7", "libvirt-daemon": "9.0.0-4"}
    iommufd = {"dev_iommu": True, "vfio_dev": True}
    level, summary, fix = _iommufd(tmp_path, packages=old, iommufd=iommufd)
    assert level is Level.INFO
    assert "QEMU 7.2 predates iommufd (9.0+)" in summary
    assert "libvirt 9.0 predates iommufd (12.1+)" in summary
    assert fix == "install QEMU 9.0+ and libvirt 12.1+ to start guests on iommufd"


def test_iommufd_from_proc_config_gz(tmp_path: Path) -> None:
    import gzip

    root = build_variant(
        tmp_path,
        "acs-override-proxmox",
        kernel={"cmdline": PROXMOX_CMDLINE},
        packages=NEW_STACK,
        iommufd={"dev_iommu": True, "vfio_dev": True},
    )
    for config in root.glob("boot/config-*"):
        config.unlink()
    (root / "proc/config.gz").write_bytes(
        gzip.compress(b"CONFIG_IOMMUFD=m\nCONFIG_VFIO_DEVICE_CDEV=y\n")
    )
    level, summary, _ = _checks(root)["iommufd"]
    assert level is Level.PASS and summary.startswith("/dev/iommu, 0000:24:00.0")
    # a gzip bomb is refused as a config: nothing read, and the problem noted
    (root / "proc/config.gz").write_bytes(gzip.compress(b"#" * (9 << 20)))
    host = discover(str(root))
    assert host.kernel.config_source is None
    assert "proc/config.gz: unpacks to more than 8 MiB" in host.problems
