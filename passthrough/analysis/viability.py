# SPDX-License-Identifier: Apache-2.0
"""What a card is (the display function and the functions that belong to it), and the
sizes and words the verdicts use. The verdicts themselves: ``analysis/policy.py``."""

from __future__ import annotations

from collections.abc import Iterable

from passthrough.analysis.codes import APU_IGPU, INTEL_IGPU
from passthrough.model import Gpu, Host, PciAddress, PciFunction
from passthrough.pciclass import (
    CLASS_WORDS,
    SUBCLASS_AUDIO_HDA,
    SUBCLASS_SERIAL_OTHER,
    SUBCLASS_USB,
)
from passthrough.units import GIB

LARGE_BAR = 32 * GIB


def describe(fn: PciFunction) -> str:
    """``0000:02:00.0 (USB controller, 1022:43ee Advanced Micro Devices ...)``"""
    kind = CLASS_WORDS.get(fn.subclass, f"class {fn.class_hex}")
    return f"{fn.address} ({kind}, {fn.id} {fn.name})"


# Classes a card carries besides its display function: HDMI/DP audio, and the USB-C
# controller and its UCSI function (Turing and later NVIDIA, RDNA2 AMD).
COMPANION_CLASSES = frozenset({SUBCLASS_AUDIO_HDA, SUBCLASS_USB, SUBCLASS_SERIAL_OTHER})


def _companion(f: PciFunction, primary: PciFunction) -> bool:
    return f.vendor_id == primary.vendor_id and (f.is_display or f.subclass in COMPANION_CLASSES)


def card_switch(primary: PciFunction, by_addr: dict[PciAddress, PciFunction]) -> PciAddress | None:
    """Upstream port of the card's own PCIe switch: the topmost unbroken run of bridges of
    the card's vendor directly above it, below the root port (Intel Arc, AMD Navi)."""
    top = None
    for addr in reversed(primary.parents[1:]):
        bridge = by_addr.get(addr)
        if bridge is None or not bridge.is_bridge_like or bridge.vendor_id != primary.vendor_id:
            break
        top = addr
    return top


def _own_card(f: PciFunction, primary: PciFunction) -> bool:
    """Whether ``f``, on ``primary``'s slot, belongs to primary's card. The hardware says
    which functions stand alone: an SR-IOV virtual function (its ``physfn`` link) is a
    device of its own, handed to a guest alone, as is the physical function beside it; a
    display function the IOMMU isolates from the primary (another group) can go to another
    guest, so it is a GPU of its own."""
    if f is primary:
        return True
    if f.physfn is not None or primary.physfn is not None:
        return False
    if f.is_display and f.iommu_group != primary.iommu_group:
        return False
    return _companion(f, primary)


def find_gpus(host: Host) -> list[Gpu]:
    """Every display controller with the functions that belong to its card: on its slot,
    of its vendor and of a companion class (see :func:`_own_card`); or behind the card's own
    switch, of its vendor and class, in its IOMMU group. A slot shared with other vendors'
    devices (an APU's security processor and USB controllers) does not make them part of
    the card; SR-IOV virtual functions are GPUs of their own, with their PF named."""
    by_addr = {f.address: f for f in host.functions}
    by_slot: dict[tuple[int, int, int], list[PciFunction]] = {}
    for f in host.functions:
        by_slot.setdefault(f.address.slot, []).append(f)
    claimed: set[PciAddress] = set()
    gpus = []
    for primary in sorted(host.functions, key=lambda f: f.address):
        if not primary.is_display or primary.address in claimed:
            continue
        members = {
            f.address: f
            for f in by_slot[primary.address.slot]
            if f.address not in claimed and _own_card(f, primary)
        }
        switch = card_switch(primary, by_addr) if primary.physfn is None else None
        if switch is not None:
            for f in host.functions:
                if (
                    switch in f.parents
                    and not f.is_display
                    and f.address not in claimed
                    and f.physfn is None
                    and f.iommu_group == primary.iommu_group
                    and _companion(f, primary)
                ):
                    members[f.address] = f
        claimed.update(members)
        gpus.append(
            Gpu(primary=primary, functions=tuple(sorted(members.values(), key=lambda f: f.address)))
        )
    return sorted(gpus, key=lambda g: g.address)


INTEL = 0x8086


def integrated(gpu: Gpu, by_addr: dict[PciAddress, PciFunction]) -> tuple[str, str] | None:
    """The finding (code, message) of an integrated GPU, which this toolkit does not target:
    an Intel iGPU sits on the root bus itself; an APU's iGPU shares its slot with the CPU's
    own devices of another vendor (AMD's security processor and USB controllers, 1022,
    beside the Radeon functions, 1002) — a discrete card's slot holds its own functions only."""
    primary = gpu.primary
    if primary.vendor_id == INTEL and not primary.parents and primary.address.bus == 0:
        return (
            INTEL_IGPU,
            "integrated GPU: assigning an Intel iGPU (GVT-d) needs its legacy IGD setup and "
            "OpRegion; this toolkit targets discrete cards",
        )
    a = primary.address
    beside = [by_addr.get(PciAddress(a.domain, a.bus, a.device, n)) for n in range(8)]
    platform = sorted(
        {f"{f.vendor_id:04x}" for f in beside if f and f.vendor_id != primary.vendor_id}
    )
    port = by_addr.get(primary.parents[0]) if primary.parents else None
    # the CPU's internal port, as the PCI ID database names it (AMD's "Internal PCIe GPP
    # Bridge"): where the slot's other devices are not in the capture, the port still says
    internal = port is not None and port.vendor_id != primary.vendor_id and "Internal" in port.name
    if (platform or internal) and primary.physfn is None:
        where = (
            f"the slot of the CPU's own devices ({', '.join(platform)})"
            if platform
            else (f"the CPU's internal port {port.address}" if port else "")
        )
        return (
            APU_IGPU,
            f"integrated GPU: an APU's, on {where}; this toolkit targets discrete cards",
        )
    return None


def mmio_window_bytes(functions: Iterable[PciFunction]) -> int:
    """Smallest power-of-two window (≥ 1 GiB) holding every 64-bit BAR of these functions;
    naturally aligned BARs pack into it without gaps."""
    total = sum(b.size for f in functions for b in f.bars if b.is_64bit and not b.is_io)
    window = GIB
    while window < total:
        window <<= 1
    return window


def mmio_window(gpu: Gpu) -> int:
    return mmio_window_bytes(gpu.functions)
