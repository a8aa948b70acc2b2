# SPDX-License-Identifier: Apache-2.0
"""Readiness checks, in the spirit of virt-host-validate, each with a one-line fix."""

from __future__ import annotations

from passthrough.analysis.codes import ACS_OVERRIDE
from passthrough.analysis.levels import finding_level, gpus_check
from passthrough.kernel import kernel_version
from passthrough.model import DIRECT_BOOT, CheckResult, GpuVerdict, Host, Level

INTEL = "GenuineIntel"
AMD = "AuthenticAMD"


def _cpu_virt(host: Host) -> CheckResult:
    if host.cpu.virt_flag:
        name = "VT-x" if host.cpu.virt_flag == "vmx" else "AMD-V"
        return CheckResult(
            "cpu-virtualization", Level.PASS, f"{name} ({host.cpu.virt_flag}) available"
        )
    return CheckResult(
        "cpu-virtualization",
        Level.FAIL,
        "CPU shows neither vmx nor svm",
        "enable Intel VT-x / AMD SVM in the firmware setup",
    )


def _kvm(host: Host) -> CheckResult:
    if host.kvm:
        return CheckResult("kvm-device", Level.PASS, "/dev/kvm present")
    module = "kvm_amd" if host.cpu.vendor == AMD else "kvm_intel"
    return CheckResult(
        "kvm-device", Level.FAIL, "/dev/kvm missing", f"load {module} (modprobe {module})"
    )


def iommu_default_on(host: Host) -> tuple[bool | None, str]:
    """Whether the IOMMU is asked for, from the command line or the kernel's default."""
    k = host.kernel
    if k.arg("iommu") == "off":
        return False, "iommu=off on the command line"
    if host.cpu.vendor == INTEL:
        if k.config.get("CONFIG_INTEL_IOMMU") == "n":
            return False, "kernel built without Intel IOMMU support (CONFIG_INTEL_IOMMU is not set)"
        arg = k.arg("intel_iommu")
        if arg is not None:
            opts = arg.split(",")
            if "off" in opts:
                return False, "intel_iommu=off on the command line"
            if "on" in opts:
                return True, "intel_iommu=on on the command line"
        default = k.config.get("CONFIG_INTEL_IOMMU_DEFAULT_ON")
        if default == "y":
            return True, "on by default in this kernel (CONFIG_INTEL_IOMMU_DEFAULT_ON=y)"
        if k.config.get("CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF") == "y":
            return True, (
                "on by default in this kernel except for an integrated GPU "
                "(CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF=y)"
            )
        if default == "n":
            return False, "off by default in this kernel (CONFIG_INTEL_IOMMU_DEFAULT_ON is not set)"
        return None, "kernel default unknown (no kernel config found)"
    if host.cpu.vendor == AMD:
        if k.config.get("CONFIG_AMD_IOMMU") == "n":
            return False, "kernel built without AMD IOMMU support (CONFIG_AMD_IOMMU is not set)"
        arg = k.arg("amd_iommu")
        if arg is not None and "off" in arg.split(","):
            return False, "amd_iommu=off on the command line"
        return True, "AMD IOMMU is on by default when the firmware enables it"
    return None, f"CPU vendor {host.cpu.vendor or 'unknown'}"


def _iommu_firmware(host: Host) -> CheckResult:
    if host.iommu.acpi_tables or host.iommu.units:
        what = ", ".join(host.iommu.acpi_tables) or ", ".join(host.iommu.units)
        return CheckResult("iommu-firmware", Level.PASS, f"IOMMU described by firmware ({what})")
    name = "AMD-Vi / IOMMU" if host.cpu.vendor == AMD else "VT-d"
    return CheckResult(
        "iommu-firmware",
        Level.FAIL,
        "no DMAR or IVRS ACPI table: the firmware does not expose an IOMMU",
        f"enable {name} in the firmware setup",
    )


def iommu_enabled(host: Host) -> CheckResult:
    """IOMMU groups populated; where none is, why (the kernel's default, an argument, the
    firmware) and the fix for that cause: check and verify say the same."""
    if host.iommu.groups:
        return CheckResult(
            "iommu-enabled", Level.PASS, f"IOMMU on: {host.iommu.groups} groups populated"
        )
    on, why = iommu_default_on(host)
    return CheckResult(
        "iommu-enabled", Level.FAIL, f"no IOMMU groups: {why}", _iommu_fix(host, on, why)
    )


def _iommu_fix(host: Host, on: bool | None, why: str) -> str:
    if on is False and "kernel built without" in why:
        return "boot a kernel built with IOMMU support (distro stock kernels have it)"
    if on is False and " on the command line" in why:
        return f"remove {why.split(' on the')[0]} from the kernel command line"
    if host.cpu.vendor == INTEL and on is not True:
        return "add intel_iommu=on to the kernel command line, then reboot"
    return "enable the IOMMU (VT-d / AMD-Vi) in the firmware setup, then reboot"


def _kernel_args(host: Host) -> CheckResult:
    k = host.kernel
    if host.cpu.vendor == AMD and k.arg("amd_iommu") == "on":
        return CheckResult(
            "kernel-iommu-args",
            Level.WARN,
            "amd_iommu=on is not a valid value (the AMD IOMMU is on by default)",
            "remove amd_iommu=on from the kernel command line",
        )
    on, why = iommu_default_on(host)
    if on is False:
        return CheckResult("kernel-iommu-args", Level.FAIL, why, _iommu_fix(host, on, why))
    if on is None:
        return CheckResult("kernel-iommu-args", Level.WARN, why, None)
    pt = " with iommu=pt" if k.arg("iommu") == "pt" else ""
    return CheckResult("kernel-iommu-args", Level.PASS, why + pt)


def _interrupt_remapping(host: Host) -> CheckResult:
    ir = host.iommu.interrupt_remapping
    ev = host.iommu.interrupt_remapping_evidence
    if ir:
        return CheckResult("interrupt-remapping", Level.PASS, f"enabled ({ev})")
    if host.iommu.allow_unsafe_interrupts:
        return CheckResult(
            "interrupt-remapping",
            Level.WARN,
            f"not enabled, and vfio_iommu_type1.allow_unsafe_interrupts=1 ({ev}): a guest can "
            "inject interrupts into the host",
            "enable interrupt remapping in firmware (x2APIC / VT-d IR) and drop the override",
        )
    if ir is None:
        return CheckResult("interrupt-remapping", Level.WARN, f"cannot tell ({ev})", None)
    return CheckResult(
        "interrupt-remapping",
        Level.FAIL,
        f"not enabled ({ev}): VFIO refuses device assignment",
        "enable interrupt remapping in firmware; last resort: "
        "vfio_iommu_type1.allow_unsafe_interrupts=1 (a security trade-off)",
    )


def _acs(host: Host) -> CheckResult:
    if host.acs_override is None:
        return CheckResult(
            "acs-override", Level.PASS, "no pcie_acs_override: groups reflect the hardware"
        )
    return CheckResult(
        ACS_OVERRIDE,
        finding_level(ACS_OVERRIDE),  # the level scan and kubevirt preflight give it too
        f"pcie_acs_override={host.acs_override}: groups are synthetic, isolation is not real",
        "move the card to a slot with its own group, or accept the risk knowingly",
    )


def _vfio(host: Host) -> CheckResult:
    state = host.kernel.vfio_pci
    if state:
        return CheckResult("vfio-modules", Level.PASS, f"vfio-pci {state}")
    cfg = host.kernel.config.get("CONFIG_VFIO_PCI")
    if cfg in ("y", "m"):
        return CheckResult(
            "vfio-modules", Level.PASS, f"vfio-pci built for this kernel (CONFIG_VFIO_PCI={cfg})"
        )
    return CheckResult(
        "vfio-modules",
        Level.FAIL,
        f"vfio-pci not found for kernel {host.kernel.release or '?'}",
        "install the distro's full kernel modules package (CONFIG_VFIO_PCI)",
    )


def _boot(host: Host) -> CheckResult:
    b = host.boot
    if b.grub is not None and b.grub.dropins is None:
        return CheckResult(
            "bootloader",
            Level.WARN,
            f"grub, but {b.grub.why}",
            "kernel arguments will have to be added by hand to the file your grub-mkconfig reads",
        )
    if b.bootloader.value != "unknown":
        return CheckResult(
            "bootloader",
            Level.PASS,
            f"{b.bootloader.value} ({'; '.join(b.bootloader_evidence)}), initramfs: {b.initramfs.value}",
        )
    if b.direct:
        return CheckResult(
            "bootloader",
            Level.WARN,
            DIRECT_BOOT,
            "kernel arguments go on what starts this machine (its hypervisor's kernel "
            "command line); plan and apply change nothing here",
        )
    return CheckResult(
        "bootloader",
        Level.WARN,
        "bootloader not recognised (none of GRUB, grubby/BLS, systemd-boot, proxmox-boot-tool, "
        "kernelstub, rpm-ostree found)",
        "kernel arguments will have to be added by hand with your bootloader's own tool",
    )


# The first releases with each piece (include/uapi/linux/iommufd.h came in 6.2; the vfio
# device cdev, drivers/vfio/device_cdev.c, in 6.6): see docs/iommufd.md.
IOMMUFD_OPTIONS = (("CONFIG_IOMMUFD", (6, 2)), ("CONFIG_VFIO_DEVICE_CDEV", (6, 6)))


def _iommufd_option_missing(host: Host, key: str, since: tuple[int, int]) -> str | None:
    """Why the running kernel lacks ``key`` (None when it has it, or when it cannot tell)."""
    k = host.kernel
    if k.config.get(key) in ("y", "m") or k.config_source is None:
        return None
    v = kernel_version(k.release)
    if v is not None and v < since:
        return f"kernel {k.release} is too old for {key} (Linux {since[0]}.{since[1]}+)"
    return f"{key} is not set in {k.config_source}"


def iommufd_kernel_lacks(host: Host) -> list[str]:
    """The options the running kernel was built without, and why, one phrase each."""
    return [
        why
        for key, since in IOMMUFD_OPTIONS
        if (why := _iommufd_option_missing(host, key, since)) is not None
    ]


def iommufd_node_lacks(host: Host) -> list[str]:
    """What the host's kernel side lacks for iommufd (options, then nodes): [] when ready.
    render, validate and kubevirt refuse with these words; the check says them too."""
    return iommufd_kernel_lacks(host) or iommufd_missing_pieces(host)[0]


def _iommufd(host: Host) -> CheckResult:
    from passthrough.host.versions import iommufd_lacks, versions_of

    off = iommufd_kernel_lacks(host)
    if off:
        # the legacy vfio container still works: an optional feature, not a fault
        return CheckResult(
            "iommufd",
            Level.INFO,
            "; ".join(off) + ": guests use the legacy vfio container (/dev/vfio/N)",
            "for iommufd boot a kernel built with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV "
            "(Linux 6.6+)",
        )
    missing, fixes = iommufd_missing_pieces(host)
    if missing:
        return CheckResult("iommufd", Level.WARN, "; ".join(missing), "; ".join(fixes))
    unread = "" if host.kernel.config_source else " (no kernel config found: by the nodes alone)"
    cdevs = host.iommu.vfio_cdevs
    bound = (
        ", ".join(f"{c.address} → /dev/vfio/devices/{c.name}" for c in cdevs)
        if cdevs
        else "no function bound to vfio-pci yet"
    )
    lacks = iommufd_lacks(versions_of(host.packages, host.tool_versions))
    if lacks:
        return CheckResult(
            "iommufd",
            Level.INFO,
            f"kernel ready (/dev/iommu, {bound}){unread}, but " + "; ".join(lacks),
            "install QEMU 9.0+ and libvirt 12.1+ to start guests on iommufd",
        )
    return CheckResult("iommufd", Level.PASS, f"/dev/iommu, {bound}{unread}")


def iommufd_missing_pieces(host: Host) -> tuple[list[str], list[str]]:
    """The nodes a kernel built for iommufd should have made and has not, with the fix."""
    io, cfg = host.iommu, host.kernel.config
    missing: list[str] = []
    fixes: list[str] = []
    if not io.dev_iommu:
        if cfg.get("CONFIG_IOMMUFD") == "m" and not io.iommufd_module:
            missing.append("/dev/iommu missing: the iommufd module is not loaded")
            fixes.append("modprobe iommufd (and list it in /etc/modules-load.d/ to keep it)")
        elif host.kernel.config_source is None and not io.iommufd_module:
            missing.append("/dev/iommu missing and no kernel config found to say why")
            fixes.append("modprobe iommufd, or boot a kernel built with CONFIG_IOMMUFD")
        else:
            missing.append("/dev/iommu missing although iommufd is in the kernel")
            fixes.append("check that devtmpfs and udev made the node (ls -l /dev/iommu)")
    for c in io.vfio_cdevs:
        if c.name is None:
            missing.append(f"{c.address} is bound to vfio-pci but has no vfio-dev/vfioN")
            # vfio core names vfio-dev/vfioN when the device registers (Linux 6.1+)
            fixes.append(f"rebind {c.address} to vfio-pci (passthrough bind)")
        elif not c.dev_node:
            missing.append(f"{c.address}: /dev/vfio/devices/{c.name} missing")
            fixes.append(
                "CONFIG_VFIO_DEVICE_CDEV makes the node: check that devtmpfs and udev made it"
            )
    return missing, fixes


def _kernel_reset(host: Host) -> CheckResult | None:
    v = kernel_version(host.kernel.release)
    reported = any(f.reset_methods is not None for f in host.functions)
    if v is not None and v < (5, 15) and not reported:
        return CheckResult(
            "kernel-version",
            Level.WARN,
            f"kernel {host.kernel.release} predates 5.15: reset methods are not reported",
            None,
        )
    return None


# Checks about being a passthrough host: inside a guest with no IOMMU of its own they give
# host advice ("enable VT-d in the firmware") that cannot apply, so they are not run there.
HOST_ONLY = frozenset(
    {
        "cpu-virtualization",
        "kvm-device",
        "iommu-firmware",
        "iommu-enabled",
        "kernel-iommu-args",
        "interrupt-remapping",
        "acs-override",
        "vfio-modules",
        "bootloader",
        "gpu-viable",
        "kernel-version",
        "iommufd",
    }
)


def guest_without_iommu(host: Host) -> bool:
    """A VM that cannot pass devices on (no vIOMMU): a guest, not a nested host."""
    io = host.iommu
    return host.machine.guest and not (io.units or io.acpi_tables or io.groups)


def _not_applicable(result: CheckResult) -> CheckResult:
    return CheckResult(
        result.id,
        Level.SKIP,
        "not applicable inside a virtual machine without an IOMMU (a host check); "
        "`passthrough guest check` checks the guest side",
    )


def run_checks(host: Host, verdicts: list[GpuVerdict]) -> list[CheckResult]:
    results = [
        _cpu_virt(host),
        _kvm(host),
        _iommu_firmware(host),
        iommu_enabled(host),
        _kernel_args(host),
        _interrupt_remapping(host),
        _acs(host),
        _vfio(host),
        _boot(host),
        gpus_check(verdicts),
        _iommufd(host),
    ]
    extra = _kernel_reset(host)
    if extra:
        results.append(extra)
    if guest_without_iommu(host):
        results = [_not_applicable(r) if r.id in HOST_ONLY else r for r in results]
    return results
