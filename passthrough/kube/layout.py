# SPDX-License-Identifier: Apache-2.0
"""The address planner's large-BAR decision, for a guest that KubeVirt runs.

KubeVirt's API has no field for what ``render`` uses when OVMF's own 64-bit window is too
small: no ``<maxphysaddr>``, no ``<pcihole64>``, no fw_cfg ``opt/ovmf/X-PciMmio64Mb`` (only
a hook sidecar could add them, outside the API). What it can say is ``cpu.model:
host-passthrough``, which gives the guest the host CPU's physical address bits; OVMF then
sizes its window from those bits by itself. So a KubeVirt guest fits when OVMF's own window
holds the cards, and is refused with the arithmetic otherwise. The same packing and firmware
model as vm/layout.py, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Sequence

from passthrough.analysis.policy import LARGE_BAR
from passthrough.model import Host, PciFunction
from passthrough.records import frozen
from passthrough.units import format_size
from passthrough.vm.layout import (
    DEVICE_ROOM,
    QEMU_DEFAULT_PHYS_BITS,
    X_PCIMMIO64,
    LayoutRefused,
    Window,
    card_bars,
    firmware_window,
    pack,
)
from passthrough.vm.versions import dotted

# virt-launcher images of KubeVirt 1.x are built from CentOS Stream 9 packages: edk2 there
# is newer than edk2-stable202211, the first OVMF that sizes its window from the CPU's bits.
# Taken as a floor, said as an assumption in every decision that relies on it.
VIRT_LAUNCHER_OVMF = (2022, 11)


class KubeVirtLayoutRefused(LayoutRefused):
    """The cards' BARs do not fit any window a KubeVirt guest can get (code large-bar)."""

    code = LARGE_BAR

    def __init__(self, why: str) -> None:
        super().__init__(f"{why} [{LARGE_BAR}]")


@frozen
class KubeVirtLayout:
    need: int  # bytes of 64-bit window the cards need, packed
    guest_bits: int
    window: Window | None  # OVMF's own window; None when no card needs one
    decisions: tuple[str, ...]


def _no_field() -> str:
    return (
        f"KubeVirt has no field for <pcihole64> or {X_PCIMMIO64} "
        "(`passthrough render` sets them for a libvirt guest)"
    )


def plan_kubevirt(
    cards: Sequence[Sequence[PciFunction]], host: Host, memory_mib: int
) -> KubeVirtLayout:
    """Whether OVMF's own window, in a KubeVirt guest with the host's bits, holds the cards."""
    say: list[str] = []
    need, alignment = pack(card_bars(fns) for fns in cards if fns)
    bits = host.cpu.phys_bits
    iommu = host.iommu.address_bits
    if not need:
        say.append("no 64-bit prefetchable BARs: nothing for the firmware to size")
        return KubeVirtLayout(0, bits or QEMU_DEFAULT_PHYS_BITS, None, tuple(say))
    if bits is None:
        raise KubeVirtLayoutRefused(
            f"the cards' 64-bit BARs need {format_size(need)} and the host CPU's physical "
            "address bits are unknown (no 'address sizes' in /proc/cpuinfo): the window OVMF "
            "would size in a KubeVirt guest cannot be told"
        )
    if iommu and bits > iommu:
        raise KubeVirtLayoutRefused(
            f"cpu.model host-passthrough gives the guest the host's {bits} bits, but the host "
            f"IOMMU maps only {iommu} bits and KubeVirt has no field to lower the guest's bits: "
            "DMA mapping would fail"
        )
    say.append(
        f"cpu.model host-passthrough: the guest gets the host's {bits} physical address bits"
    )
    window, limit = firmware_window(bits, host.cpu.vendor, memory_mib, VIRT_LAUNCHER_OVMF, None)
    room = need + DEVICE_ROOM
    ovmf = f"OVMF (virt-launcher's, assumed {dotted(VIRT_LAUNCHER_OVMF)} or newer)"
    if room > window.size or window.end > limit:
        how = (
            f"2^{bits}/8 = {format_size(window.size)}"
            if window.how == "dynamic"
            else f"its {format_size(window.size)} fallback: it does not size one from {bits} bits"
        )
        raise KubeVirtLayoutRefused(
            f"the cards' 64-bit BARs need {format_size(need)} + {format_size(DEVICE_ROOM)} for "
            f"the VM's other devices = {format_size(room)}; in a KubeVirt guest {ovmf} makes "
            f"the window itself: {how} at {window.base:#x}..{window.end:#x} (guest limit "
            f"{format_size(limit)}), too small; {_no_field()}"
        )
    say.append(
        f"64-bit prefetchable BARs need {format_size(need)} packed (aligned to "
        f"{format_size(alignment)}); {ovmf} sizes its {window.how} window of "
        f"{format_size(window.size)} at {window.base:#x}..{window.end:#x}: enough, nothing to "
        "set in KubeVirt"
    )
    return KubeVirtLayout(need, bits, window, tuple(say))
