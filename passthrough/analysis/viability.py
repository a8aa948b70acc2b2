"""Which GPUs can be handed to a guest, and why or why not."""

from __future__ import annotations

import re
from collections.abc import Iterable

from passthrough.model import (
    BMC_VGA_VENDORS,
    NVIDIA,
    SUBCLASS_3D,
    Gpu,
    GpuVerdict,
    Host,
    PciAddress,
    PciFunction,
)

GIB = 1 << 30
LARGE_BAR = 32 * GIB
INTEL_VENDOR = 0x8086  # OVMF's historic 64-bit MMIO aperture
CLASS_WORDS = {
    0x0100: "SCSI controller",
    0x0101: "IDE controller",
    0x0104: "RAID controller",
    0x0106: "SATA controller",
    0x0108: "NVMe controller",
    0x0200: "Ethernet controller",
    0x0207: "InfiniBand controller",
    0x0280: "network controller",
    0x0300: "VGA controller",
    0x0302: "3D controller",
    0x0380: "display controller",
    0x0403: "audio device",
    0x0600: "host bridge",
    0x0601: "ISA bridge",
    0x0604: "PCI bridge",
    0x0609: "PCI bridge",
    0x0680: "bridge",
    0x0C03: "USB controller",
    0x0C05: "SMBus controller",
    0x0C80: "serial bus controller",
}


def kernel_version(release: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(m[1]), int(m[2])) if m else None


def describe(fn: PciFunction) -> str:
    """``0000:02:00.0 (USB controller, 1022:43ee Advanced Micro Devices ...)``"""
    kind = CLASS_WORDS.get(fn.subclass, f"class {fn.class_hex}")
    return f"{fn.address} ({kind}, {fn.id} {fn.name})"


def find_gpus(host: Host) -> list[Gpu]:
    """Every display controller, with all other functions of its card (same slot)."""
    by_slot: dict[tuple[int, int, int], list[PciFunction]] = {}
    for f in host.functions:
        by_slot.setdefault(f.address.slot, []).append(f)
    gpus = []
    for functions in by_slot.values():
        displays = [f for f in functions if f.is_display]
        if displays:
            gpus.append(
                Gpu(
                    primary=displays[0], functions=tuple(sorted(functions, key=lambda f: f.address))
                )
            )
    return sorted(gpus, key=lambda g: g.address)


def _human_size(size: int) -> str:
    for unit, factor in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:g} {unit}"
    return f"{size} B"


def mmio_window_bytes(functions: Iterable[PciFunction]) -> int:
    """Smallest power-of-two window (≥ 1 GiB) holding every 64-bit BAR of these functions;
    naturally aligned BARs pack into it without gaps."""
    total = sum(b.size for f in functions for b in f.bars if b.is_64bit and not b.is_io)
    window = 1 << 30
    while window < total:
        window <<= 1
    return window


def mmio_window(gpu: Gpu) -> int:
    return mmio_window_bytes(gpu.functions)


def judge(
    host: Host,
    gpu: Gpu,
    all_gpus: list[Gpu],
    by_addr: dict[PciAddress, PciFunction] | None = None,
    nvswitches: list[PciFunction] | None = None,
) -> GpuVerdict:
    reasons: list[str] = []
    warnings: list[str] = []
    if by_addr is None:
        by_addr = {f.address: f for f in host.functions}
    card = {f.address for f in gpu.functions}
    primary = gpu.primary

    vendor = BMC_VGA_VENDORS.get(primary.vendor_id)
    if vendor is not None:
        reasons.append(
            f"server management VGA ({vendor}): the host console through the BMC, never a candidate"
        )

    members: list[PciAddress] = []
    groups = host.group_index
    missing = [f for f in gpu.functions if f.iommu_group is None]
    if missing:
        if not host.groups and host.machine.guest:
            reasons.append(
                "inside a virtual machine with no IOMMU: this GPU is passed through to this "
                "guest and cannot be passed on (`passthrough guest check` checks it)"
            )
        elif not host.groups:
            reasons.append("no IOMMU groups on this host: the IOMMU is off or absent")
        else:
            reasons.append("no IOMMU group for " + ", ".join(str(f.address) for f in missing))
    for number in gpu.groups:
        group = groups[number]
        members.extend(group.members)
        others = [
            by_addr[a]
            for a in group.members
            if a not in card and a in by_addr and not by_addr[a].is_bridge_like
        ]
        other_gpu_slots = {f.address.slot for f in others if f.is_display}
        for other in others:
            if other.address.slot in other_gpu_slots:
                if not other.is_display:
                    continue  # told with its card below
                siblings = [
                    str(f.address)
                    for f in others
                    if f.address.slot == other.address.slot and f is not other
                ]
                extra = f" with its functions {', '.join(siblings)}" if siblings else ""
                reasons.append(
                    f"IOMMU group {number} also holds another GPU: {describe(other)}{extra}; "
                    "both cards would have to go to the same guest"
                )
            else:
                reasons.append(
                    f"IOMMU group {number} also holds a device outside the card: "
                    f"{describe(other)}; it would have to go to the same guest"
                )
        for other in others:
            addr = other.address
            if addr in host.critical.root_pci:
                reasons.append(
                    f"IOMMU group {number} holds the host's root-disk controller {addr} "
                    f"({host.critical.root_device or '/'}): binding the group to vfio-pci would "
                    "cut the host off its root filesystem — refused"
                )
            if addr in host.critical.nic_pci:
                reasons.append(
                    f"IOMMU group {number} holds the NIC of the default route {addr} "
                    f"({host.critical.default_nic}): binding the group to vfio-pci would cut "
                    "the host off the network — refused"
                )

    if vendor is not None:
        return GpuVerdict(gpu, False, tuple(sorted(set(members))), tuple(reasons), ())
    if primary.boot_vga:
        simplefb = host.kernel.config.get("CONFIG_SYSFB_SIMPLEFB") == "y"
        arg = "initcall_blacklist=sysfb_init" if simplefb else "video=efifb:off"
        warnings.append(
            "boot VGA: firmware and the host console draw on it; handing it over needs the "
            f"console moved off it ({arg}) and may need the card's ROM for the guest"
        )
    # A 3D controller (0x0302, e.g. a data-centre GPU) has no display output: handing it over
    # takes no console away, and it does not count as one of the host's displays.
    outputs = [g for g in all_gpus if g.primary.subclass != SUBCLASS_3D]
    if primary.subclass != SUBCLASS_3D and len(outputs) == 1:
        warnings.append("the host's only display controller: the host keeps no local display")
    if host.acs_override is not None:
        warnings.append(
            f"pcie_acs_override={host.acs_override} is in effect: these IOMMU groups are "
            "synthetic and the isolation they suggest is not real"
        )
    version = kernel_version(host.kernel.release)
    if primary.reset_methods == () or (
        primary.reset_methods is None and version is not None and version >= (5, 15)
    ):
        warnings.append(
            "no reset method (sysfs reset_method is empty): the card may not survive a guest "
            "reboot or a VM restart"
        )
    large = [(f, b) for f in gpu.functions for b in f.bars if not b.is_io and b.size >= LARGE_BAR]
    if large:
        _fn, bar = max(large, key=lambda fb: fb[1].size)
        warnings.append(
            f"BAR{bar.index} is {_human_size(bar.size)}: the guest needs a 64-bit MMIO window "
            f"of at least {_human_size(mmio_window(gpu))} for this card (pcihole64 and OVMF "
            "X-PciMmio64Mb), more than OVMF's old 32 GiB default"
        )
    if primary.vendor_id == INTEL_VENDOR and not primary.parents and primary.address.bus == 0:
        warnings.append(
            "integrated GPU: assigning an Intel iGPU (GVT-d) needs its legacy IGD setup and "
            "OpRegion; this toolkit targets discrete cards"
        )
    if nvswitches is None:
        nvswitches = _nvswitches(host)
    if nvswitches and primary.vendor_id == NVIDIA:
        warnings.append(
            f"NVSwitch system ({len(nvswitches)} NVSwitches): NVLink needs either every GPU and "
            "NVSwitch in one guest (Fabric Manager inside it) or GPUs only with Fabric Manager "
            "on the host (shared NVSwitch)"
        )
    if host.dmi.is_portable and primary.subclass == SUBCLASS_3D:
        warnings.append(
            "laptop 3D controller (Optimus/muxless): no display outputs of its own; the guest "
            "gets rendering and compute only, and its driver may need the vBIOS from ACPI"
        )
    if primary.physfn is not None:
        warnings.append(f"SR-IOV virtual function of {primary.physfn}")
    bound = [f for f in gpu.functions if f.driver == "vfio-pci"]
    if bound:
        if len(bound) == len(gpu.functions):
            warnings.append("already bound to vfio-pci: ready for a guest")
        else:
            warnings.append(
                "partly bound to vfio-pci: "
                + ", ".join(f"{f.address} → {f.driver or 'no driver'}" for f in gpu.functions)
            )
    return GpuVerdict(
        gpu=gpu,
        viable=not reasons,
        group_members=tuple(sorted(set(members))),
        reasons=tuple(reasons),
        warnings=tuple(warnings),
    )


def _nvswitches(host: Host) -> list[PciFunction]:
    return [f for f in host.functions if f.vendor_id == NVIDIA and f.subclass == 0x0680]


def judge_all(host: Host) -> list[GpuVerdict]:
    gpus = find_gpus(host)
    by_addr = {f.address: f for f in host.functions}
    nvswitches = _nvswitches(host)
    return [judge(host, gpu, gpus, by_addr, nvswitches) for gpu in gpus]
