# SPDX-License-Identifier: Apache-2.0
"""Host facts other than PCI functions and how the root boots (boot.py): CPU, IOMMU,
kernel, distro, what the host cannot live without. Each reader takes the root and reads
only below it."""

from __future__ import annotations

import re
from collections.abc import Iterable

from passthrough.guest.virt import VirtualMachine
from passthrough.guest.virt import detect as detect_vm
from passthrough.host.root import HostRoot
from passthrough.model import (
    Cpu,
    Distro,
    Dmi,
    Iommu,
    Kernel,
    PciFunction,
    VfioCdev,
)

# Kernel options that change what passthrough needs.
KERNEL_CONFIG_KEYS = (
    "CONFIG_INTEL_IOMMU",
    "CONFIG_INTEL_IOMMU_DEFAULT_ON",
    "CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF",  # Debian's kernels: on, except for an iGPU
    "CONFIG_INTEL_IOMMU_DEFAULT_OFF",
    "CONFIG_INTEL_IOMMU_SCALABLE_MODE_DEFAULT_ON",
    "CONFIG_AMD_IOMMU",
    "CONFIG_IOMMU_DEFAULT_PASSTHROUGH",
    "CONFIG_IRQ_REMAP",
    "CONFIG_VFIO",
    "CONFIG_VFIO_PCI",
    "CONFIG_IOMMUFD",  # /dev/iommu (Linux 6.2+)
    "CONFIG_VFIO_DEVICE_CDEV",  # /dev/vfio/devices/vfioN (Linux 6.6+)
    "CONFIG_SYSFB_SIMPLEFB",
    "CONFIG_FB_EFI",
)


def read_cpu(root: HostRoot) -> Cpu:
    text = root.read("proc/cpuinfo") or ""
    vendor = model = None
    flags: set[str] = set()
    count = 0
    phys_bits = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        value = value.strip()
        if key == "processor":
            count += 1
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key == "model name" and model is None:
            model = value
        elif key == "flags" and not flags:
            flags = set(value.split())
        elif key == "address sizes" and phys_bits is None:
            m = re.match(r"(\d+) bits physical", value)
            phys_bits = int(m[1]) if m else None
    virt = "vmx" if "vmx" in flags else "svm" if "svm" in flags else None
    return Cpu(vendor=vendor, model=model, virt_flag=virt, logical_cpus=count, phys_bits=phys_bits)


def read_memory_mib(root: HostRoot) -> int | None:
    """The host's RAM (MemTotal), which guest memory and boot-time huge pages must fit in."""
    for line in (root.read("proc/meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        number, _, unit = value.strip().partition(" ")
        if key == "MemTotal" and number.isdigit() and unit == "kB":
            return int(number) >> 10
    return None


def read_kernel(root: HostRoot) -> Kernel:
    release = root.read("proc/sys/kernel/osrelease")
    cmdline = tuple((root.read("proc/cmdline") or "").split())
    config: dict[str, str] = {}
    source = None
    text: str | None = None
    if release and root.exists(f"boot/config-{release}"):
        source = f"/boot/config-{release}"
        text = root.read(f"boot/config-{release}")
    elif root.exists("proc/config.gz"):
        raw = root.read_bytes("proc/config.gz")
        if raw is not None:
            text = _gunzip_config(root, raw)
            source = "/proc/config.gz" if text is not None else None
    if text is not None:
        wanted = set(KERNEL_CONFIG_KEYS)
        for line in text.splitlines():
            if line.startswith("CONFIG_"):
                key, _, value = line.partition("=")
                if key in wanted:
                    config[key] = value
            elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
                key = line[2:-11]
                if key in wanted:
                    config[key] = "n"
    return Kernel(
        release=release,
        cmdline=cmdline,
        config=config,
        config_source=source,
        vfio_pci=_vfio_pci_state(root, release),
    )


# A kernel's whole config is about 300 KB unpacked; far more is not a config (a gzip bomb).
MAX_CONFIG = 8 << 20


def _gunzip_config(root: HostRoot, raw: bytes) -> str | None:
    import zlib  # only for /proc/config.gz

    unpack = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
    try:
        data = unpack.decompress(raw, MAX_CONFIG)
    except zlib.error:
        root.problems.append("proc/config.gz: not a gzip file")
        return None
    if unpack.unconsumed_tail:
        root.problems.append(f"proc/config.gz: unpacks to more than {MAX_CONFIG >> 20} MiB")
        return None
    return data.decode("utf-8", "replace")


def _vfio_pci_state(root: HostRoot, release: str | None) -> str | None:
    if root.exists("sys/module/vfio_pci"):
        return "loaded"
    if not release:
        return None
    moddir = f"lib/modules/{release}"
    builtin = root.read(f"{moddir}/modules.builtin") or ""
    if re.search(r"(^|/)vfio-pci\.ko$", builtin, re.MULTILINE):
        return "builtin"
    dep = root.read(f"{moddir}/modules.dep") or ""
    if re.search(r"(^|/)vfio-pci\.ko(\.[gx]?z|\.zst)?:", dep, re.MULTILINE):
        return "module"
    return None


def read_iommu(root: HostRoot, kernel: Kernel, functions: Iterable[PciFunction] = ()) -> Iommu:
    units = tuple(root.listdir("sys/class/iommu"))
    tables = tuple(t for t in ("DMAR", "IVRS") if root.exists(f"sys/firmware/acpi/tables/{t}"))
    groups = sum(
        1
        for g in root.listdir("sys/kernel/iommu_groups")
        if root.listdir(f"sys/kernel/iommu_groups/{g}/devices")
    )
    ir, evidence = _interrupt_remapping(root, kernel, units)
    unsafe_raw = root.read("sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts")
    unsafe = None if unsafe_raw is None else unsafe_raw in ("Y", "1")
    if unsafe is None and kernel.arg("vfio_iommu_type1.allow_unsafe_interrupts") in ("1", "Y", "y"):
        unsafe = True
    return Iommu(
        units=units,
        acpi_tables=tables,
        groups=groups,
        interrupt_remapping=ir,
        interrupt_remapping_evidence=evidence,
        allow_unsafe_interrupts=unsafe,
        address_bits=_iommu_address_bits(root, units),
        dev_iommu=root.exists("dev/iommu"),
        iommufd_module=root.isdir("sys/module/iommufd"),
        vfio_cdevs=tuple(read_vfio_cdevs(root, functions)),
    )


# a function has one device cdev at most; a directory that lists more is not the kernel's
MAX_CDEV_NAMES = 16


def read_vfio_cdevs(root: HostRoot, functions: Iterable[PciFunction]) -> list[VfioCdev]:
    """Each vfio-pci function's ``vfio-dev/vfioN`` (drivers/vfio/vfio_main.c names it when
    the device registers) and whether its ``/dev/vfio/devices/vfioN`` node exists."""
    found = []
    for f in functions:
        if f.driver != "vfio-pci":
            continue
        names = [
            n
            for n in root.listdir(f"{f.sysfs_path}/vfio-dev")[:MAX_CDEV_NAMES]
            if n.startswith("vfio") and n[4:].isdigit()
        ]
        name = min(names, key=lambda n: int(n[4:])) if names else None
        node = name is not None and root.exists(f"dev/vfio/devices/{name}")
        found.append(VfioCdev(f.address, name, node))
    return found


def _iommu_address_bits(root: HostRoot, units: tuple[str, ...]) -> int | None:
    """The narrowest Intel VT-d MGAW (capability register bits 21:16, plus one) over the
    units: a guest address above it cannot be mapped for DMA. AMD-Vi exposes no such width
    in sysfs that this code trusts, so AMD hosts stay unknown (None)."""
    widths = []
    for unit in units:
        raw = root.read(f"sys/class/iommu/{unit}/intel-iommu/cap")
        if raw is None:
            continue
        try:
            cap = int(raw.strip(), 16)
        except ValueError:
            root.problems.append(f"sys/class/iommu/{unit}/intel-iommu/cap: not hexadecimal")
            continue
        widths.append(((cap >> 16) & 0x3F) + 1)
    return min(widths) if widths else None


def _interrupt_remapping(
    root: HostRoot, kernel: Kernel, units: tuple[str, ...]
) -> tuple[bool | None, str]:
    if kernel.arg("intremap") == "off" or kernel.arg("nointremap") is not None:
        return False, "disabled on the kernel command line"
    interrupts = root.read("proc/interrupts")
    if interrupts:
        # With remapping on, the kernel names its MSI/IO-APIC irq chips "IR-...".
        if re.search(r"\bIR-(PCI-MSI|PCI-MSIX|IO-APIC|MSI)", interrupts):
            return True, "/proc/interrupts shows IR- interrupt chips"
        if re.search(r"\b(PCI-MSI|PCI-MSIX|IO-APIC)", interrupts):
            return False, "/proc/interrupts shows no IR- interrupt chips"
    for unit in units:
        ecap = root.read(f"sys/class/iommu/{unit}/intel-iommu/ecap")
        if ecap:
            try:
                supported = bool(int(ecap, 16) & (1 << 3))  # ECAP.IR (VT-d spec)
            except ValueError:
                continue
            return (None if supported else False), (
                f"{unit} ecap says the hardware {'supports' if supported else 'lacks'} it"
            )
    return None, "no evidence either way"


def read_distro(root: HostRoot) -> Distro:
    text = root.read("etc/os-release")
    if text is None:
        target = root.resolve("etc/os-release")
        text = root.read(target) if target else root.read("usr/lib/os-release")
    values: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"').strip("'")
    return Distro(
        id=values.get("ID"),
        id_like=tuple(values.get("ID_LIKE", "").split()),
        version_id=values.get("VERSION_ID"),
        pretty_name=values.get("PRETTY_NAME"),
    )


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-3,8-11`` → (0, 1, 2, 3, 8, 9, 10, 11)."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        if not (first.isdigit() and (not sep or last.isdigit())):
            raise ValueError(part)
        cpus.extend(range(int(first), int(last) + 1) if sep else [int(first)])
    return tuple(cpus)


def read_numa(root: HostRoot) -> dict[int, tuple[int, ...]]:
    nodes: dict[int, tuple[int, ...]] = {}
    for name in root.listdir("sys/devices/system/node"):
        if name.startswith("node") and name[4:].isdigit():
            text = root.read(f"sys/devices/system/node/{name}/cpulist")
            if text is None:
                continue
            try:
                nodes[int(name[4:])] = parse_cpulist(text)
            except ValueError:
                from passthrough.errors import MalformedHostData

                raise MalformedHostData(
                    root.abs(f"sys/devices/system/node/{name}/cpulist"), f"not a CPU list: {text!r}"
                ) from None
    return nodes


def read_thread_siblings(root: HostRoot, cpus: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """Each CPU's hardware threads on its core (sysfs ``thread_siblings_list``); a CPU whose
    list is missing or unreadable is left out (the caller does without it)."""
    siblings: dict[int, tuple[int, ...]] = {}
    for cpu in cpus:
        text = root.read(f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            siblings[cpu] = parse_cpulist(text) if text else ()
        except ValueError:
            continue
    return {cpu: sib for cpu, sib in siblings.items() if sib}


def read_machine(root: HostRoot, functions: Iterable[PciFunction]) -> VirtualMachine:
    """Whether the root is a virtual machine (the guest package's detector: one for both),
    from the PCI functions discovery has read already."""
    return detect_vm(root.read, ((str(f.address), f.vendor_id, f.device_id) for f in functions))


def read_dmi(root: HostRoot) -> Dmi:
    chassis = root.read("sys/class/dmi/id/chassis_type")
    return Dmi(
        chassis_type=int(chassis) if chassis and chassis.isdigit() else None,
        sys_vendor=root.read("sys/class/dmi/id/sys_vendor"),
        product_name=root.read("sys/class/dmi/id/product_name"),
    )
