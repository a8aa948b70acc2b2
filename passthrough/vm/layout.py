# SPDX-License-Identifier: Apache-2.0
"""The guest's address layout for large BARs: the 64-bit MMIO window, the guest's physical
address bits, and the elements that carry them — decided before any domain exists.

The firmware model is OVMF's (edk2 ``OvmfPkg/Library/PlatformInitLib/MemDetect.c``); the
docs/large-bars.md lists each fact and where it was checked. A layout that cannot
work is refused here with the numbers (exit 2), never rendered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import field
from typing import Any, Literal

from passthrough.errors import PassthroughError
from passthrough.model import PciAddress, PciFunction
from passthrough.records import frozen
from passthrough.units import GIB, MIB, format_size
from passthrough.vm.versions import DEFAULT_VERSIONS, Versions, dotted

OVMF_FALLBACK = 32 * GIB  # OVMF's 64-bit aperture when it does not size one itself
OVMF_MAX_BITS = 46  # OVMF clamps trusted CPU bits to this (it avoids 5-level paging)
OVMF_DYNAMIC_SINCE = (2022, 11)  # edk2-stable202211: the window sized from the CPU's bits
X_PCIMMIO64_MAX_MIB = 0x1000000  # OVMF ignores opt/ovmf/X-PciMmio64Mb above 16 TiB
MAXPHYSADDR_SINCE = (8, 7)  # libvirt <maxphysaddr mode='passthrough|emulate'>
MAXPHYSADDR_LIMIT_SINCE = (9, 3)  # libvirt <maxphysaddr mode='passthrough' limit='N'>
# No libvirt release is known to accept opt/ovmf/ names in <sysinfo type='fwcfg'>: 9.0 and
# later refuse them as reserved. When one does, set its version here and the planner uses it.
FWCFG_OVMF_NATIVE_SINCE: tuple[int, int] | None = None
QEMU_DEFAULT_PHYS_BITS = 40  # what QEMU's CPU models report when nobody sets phys-bits
QEMU_HOST_BITS_SINCE = (6, 0)  # -cpu host under KVM turns host-phys-bits on by itself
Q35_LOWMEM = 2 * GIB  # q35 keeps 2 GiB of RAM below 4 GiB once RAM reaches 2.75 GiB
Q35_LOWMEM_THRESHOLD = 0xB000_0000
FOUR_GIB = 4 * GIB
# Room in the 64-bit window for the domain's own devices beside the cards: libvirt puts each
# virtio device (a 64-bit prefetchable BAR) and the USB controller behind root ports whose
# windows OVMF places in the same aperture. A window sized exactly to the cards leaves the
# largest card BAR out — the lab saw it: a 64 GiB BAR in a 64 GiB window, "no space".
DEVICE_ROOM = GIB
X_PCIMMIO64 = "opt/ovmf/X-PciMmio64Mb"


class LayoutRefused(PassthroughError):
    """The guest cannot address what its cards need: nothing is rendered."""


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a if a > 1 else n


# -- BARs -----------------------------------------------------------------------------------


@frozen
class CardBars:
    """One guest root port's devices: the BARs that go in the 64-bit window and the rest."""

    address: PciAddress
    high: tuple[int, ...]  # 64-bit prefetchable BAR sizes, largest first
    low: int  # bytes of the other memory BARs (32-bit, or 64-bit non-prefetchable)

    @property
    def alignment(self) -> int:
        return self.high[0] if self.high else 0

    @property
    def size(self) -> int:
        # naturally aligned BARs, largest first, pack without gaps
        return sum(self.high)


def card_bars(functions: Sequence[PciFunction]) -> CardBars:
    """Only 64-bit prefetchable BARs can sit above 4 GiB behind a root port (a bridge's
    non-prefetchable window is 32-bit), so the others count towards the low window."""
    high = sorted(
        (b.size for f in functions for b in f.bars if b.is_64bit and b.prefetchable and b.size),
        reverse=True,
    )
    low = sum(
        b.size
        for f in functions
        for b in f.bars
        if not b.is_io and not (b.is_64bit and b.prefetchable)
    )
    return CardBars(min(f.address for f in functions), tuple(high), low)


def pack(cards: Iterable[CardBars]) -> tuple[int, int]:
    """(bytes, alignment) of the 64-bit window the root ports need: the firmware places
    bridge windows largest alignment first, each on its own alignment."""
    end = 0
    ordered = sorted((c for c in cards if c.high), key=lambda c: c.alignment, reverse=True)
    for c in ordered:
        end = _align(end, c.alignment) + c.size
    return end, ordered[0].alignment if ordered else 0


# -- the firmware model ---------------------------------------------------------------------


def ram_end(memory_mib: int) -> int:
    """First address above the guest's RAM on q35 (QEMU splits RAM at 2 GiB below 4 GiB)."""
    ram = memory_mib * MIB
    high = ram - Q35_LOWMEM if ram >= Q35_LOWMEM_THRESHOLD else 0
    return FOUR_GIB + high


def ovmf_trusts(bits: int, vendor: str | None) -> bool:
    """OVMF believes the CPU's bit count when it is 41 or more, or exactly what real parts
    report below that (Intel 36 or 39, AMD 40); QEMU's historic default 40 is not believed
    on Intel."""
    if bits >= 41:
        return True
    if vendor == "GenuineIntel":
        return bits in (36, 39)
    if vendor == "AuthenticAMD":
        return bits == 40
    return False


# how OVMF placed its 64-bit window; how X-PciMmio64Mb reaches it
WindowHow = Literal["dynamic", "classic"]
FwcfgVia = Literal["sysinfo", "qemu:commandline"]


@frozen
class Window:
    base: int
    size: int
    how: WindowHow  # dynamic: OVMF sized it from the bits; classic: 32 GiB or X-PciMmio64Mb

    @property
    def end(self) -> int:
        return self.base + self.size


def firmware_window(
    guest_bits: int, vendor: str | None, memory_mib: int, ovmf: tuple[int, int], x_mib: int | None
) -> tuple[Window, int]:
    """Where OVMF puts its 64-bit aperture, and the highest address it lets itself use."""
    trusted = ovmf >= OVMF_DYNAMIC_SINCE and ovmf_trusts(guest_bits, vendor)
    size = _align(x_mib * MIB, GIB) if x_mib else OVMF_FALLBACK
    base = _align(_align(ram_end(memory_mib), GIB), _pow2_floor(size))
    if not trusted:
        return Window(base, size, "classic"), 1 << guest_bits
    bits = min(guest_bits, OVMF_MAX_BITS)
    space, mmio = 1 << bits, 1 << (bits - 3)
    if size < mmio and base + mmio < space:
        return Window(space - mmio, mmio, "dynamic"), space
    return Window(base, size, "classic"), space


# -- the plan -------------------------------------------------------------------------------


@frozen
class MaxPhysAddr:
    mode: Literal["passthrough", "emulate"]
    bits: int | None = None  # emulate
    limit: int | None = None  # passthrough, libvirt >= 9.3


@frozen
class Layout:
    need: int  # bytes of 64-bit window the cards' BARs need, packed
    alignment: int
    low: int  # bytes of BARs below 4 GiB
    guest_bits: int
    maxphysaddr: MaxPhysAddr | None
    window: Window  # where OVMF will put the aperture
    address_limit: int
    fwcfg_mib: int | None  # opt/ovmf/X-PciMmio64Mb, or None: OVMF's own sizing suffices
    fwcfg_via: FwcfgVia | None
    pcihole64_kib: int | None
    versions: Versions
    decisions: tuple[str, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        m = self.maxphysaddr
        return {
            "need_bytes": self.need,
            "alignment_bytes": self.alignment,
            "low_bytes": self.low,
            "guest_phys_bits": self.guest_bits,
            "maxphysaddr": None
            if m is None
            else {k: v for k, v in (("mode", m.mode), ("bits", m.bits), ("limit", m.limit)) if v},
            "window": {"base": self.window.base, "size": self.window.size, "how": self.window.how},
            "address_limit": self.address_limit,
            "fwcfg_x_pcimmio64_mb": self.fwcfg_mib,
            "fwcfg_via": self.fwcfg_via,
            "pcihole64_kib": self.pcihole64_kib,
            "versions": self.versions.as_json(),
            "decisions": list(self.decisions),
        }


def _choose_bits(
    host_bits: int | None,
    iommu_bits: int | None,
    versions: Versions,
    virt_type: str,
    say: list[str],
) -> tuple[int, MaxPhysAddr | None]:
    if host_bits is None:
        say.append(
            "the host CPU's physical address bits are unknown (no 'address sizes' in "
            f"/proc/cpuinfo): no <maxphysaddr>, QEMU's default {QEMU_DEFAULT_PHYS_BITS} assumed"
        )
        return QEMU_DEFAULT_PHYS_BITS, None
    target = min(host_bits, iommu_bits) if iommu_bits else host_bits
    iommu_note = (
        f"IOMMU maps {iommu_bits} bits"
        if iommu_bits
        else "IOMMU address width unknown (only Intel VT-d reports one)"
    )
    if versions.libvirt < MAXPHYSADDR_SINCE:
        # QEMU 6.0+ gives -cpu host (KVM) the host's bits by itself; otherwise its default
        bits = (
            host_bits
            if virt_type == "kvm" and versions.qemu >= QEMU_HOST_BITS_SINCE
            else QEMU_DEFAULT_PHYS_BITS
        )
        say.append(
            f"libvirt {dotted(versions.libvirt)} has no <maxphysaddr> (8.7+): the guest "
            f"gets QEMU {dotted(versions.qemu)}'s {bits} bits"
        )
        return bits, None
    why = f"host CPU has {host_bits} bits, {iommu_note}"
    if virt_type == "kvm" and target == host_bits:
        say.append(f"guest gets the host's {host_bits} physical address bits ({why})")
        return target, MaxPhysAddr("passthrough")
    if virt_type == "kvm" and versions.libvirt >= MAXPHYSADDR_LIMIT_SINCE:
        say.append(f"guest gets the host's bits limited to {target} ({why})")
        return target, MaxPhysAddr("passthrough", limit=target)
    say.append(
        f"guest CPU given {target} physical address bits ({why}; "
        + (
            "libvirt before 9.3 has no passthrough limit"
            if virt_type == "kvm"
            else "an emulated CPU"
        )
        + ")"
    )
    return target, MaxPhysAddr("emulate", bits=target)


def _window(
    need: int,
    bits: int,
    cpu_vendor: str | None,
    memory_mib: int,
    versions: Versions,
    say: list[str],
) -> tuple[Window, int, int | None]:
    """OVMF's own window when it is enough (and trusted), else one set through X-PciMmio64Mb:
    (window, the guest's address limit, X in MiB or None)."""
    own, limit = firmware_window(bits, cpu_vendor, memory_mib, versions.ovmf, None)
    x_mib: int | None = None
    window = own
    ovmf_text = dotted(versions.ovmf)
    room = need + DEVICE_ROOM  # the cards and the domain's other devices
    if (
        need
        and room <= own.size
        and own.end <= limit
        and not (versions.assumed and need > OVMF_FALLBACK)
    ):
        # an OVMF version taken for granted is said to be one (the root's packages did not tell)
        assumed = (
            " (assumed: the root's packages do not say)" if versions.is_assumed("ovmf") else ""
        )
        which = f"OVMF {ovmf_text}{assumed}"
        say.append(
            f"{which} sizes its own {own.how} window of {format_size(own.size)} at "
            f"{own.base:#x}: enough, no window element"
        )
    elif need:
        x_mib = pow2_ceil(room) // MIB
        if x_mib > X_PCIMMIO64_MAX_MIB:
            raise LayoutRefused(
                f"the cards need a {format_size(need)} 64-bit window; OVMF accepts at most 16 TiB"
            )
        window, limit = firmware_window(bits, cpu_vendor, memory_mib, versions.ovmf, x_mib)
        reason = (
            f"OVMF's own window ({own.how}, {format_size(own.size)}) is too small"
            if room > own.size or own.end > limit
            else f"the firmware's version is {versions.source}, so its own sizing is not relied on"
        )
        say.append(
            f"{reason}: {X_PCIMMIO64}={x_mib} ({format_size(x_mib * MIB)}: the cards' "
            f"{format_size(need)} and {format_size(DEVICE_ROOM)} for the domain's other devices, "
            "to a power of two: OVMF aligns the aperture to it anyway)"
        )
    return window, limit, x_mib


def _fwcfg_route(
    x_mib: int | None, need: int, versions: Versions, say: list[str]
) -> tuple[FwcfgVia | None, int | None]:
    """How X-PciMmio64Mb reaches the firmware, and the matching 64-bit PCI hole (KiB)."""
    via: FwcfgVia | None = None
    hole: int | None = None
    if x_mib is not None:
        if FWCFG_OVMF_NATIVE_SINCE is not None and versions.libvirt >= FWCFG_OVMF_NATIVE_SINCE:
            via = "sysinfo"
        else:
            via = "qemu:commandline"
            say.append(
                f"{X_PCIMMIO64} goes through <qemu:commandline>: libvirt refuses opt/ovmf/ "
                "names in <sysinfo type='fwcfg'> as reserved"
            )
        hole = x_mib * 1024
        say.append(
            f"<pcihole64> {hole} KiB on pcie-root: QEMU's 64-bit PCI hole "
            "(q35-pcihost.pci-hole64-size) covers the same window"
        )
    elif not need:
        say.append("no 64-bit prefetchable BARs: no window element")
    return via, hole


def plan_layout(
    cards: Sequence[Sequence[PciFunction]],
    *,
    host_bits: int | None,
    iommu_bits: int | None,
    cpu_vendor: str | None,
    memory_mib: int,
    versions: Versions = DEFAULT_VERSIONS,
    virt_type: str = "kvm",
) -> Layout:
    """Decide the guest's layout for these cards (one list of functions per root port)."""
    say: list[str] = []
    bars = [card_bars(fns) for fns in cards if fns]
    need, alignment = pack(bars)
    low = sum(c.low for c in bars)
    bits, maxphys = _choose_bits(host_bits, iommu_bits, versions, virt_type, say)
    if iommu_bits and bits > iommu_bits:
        raise LayoutRefused(
            f"guest physical addresses reach 2^{bits} = {format_size(1 << bits)} but the host IOMMU "
            f"maps only {iommu_bits} bits ({format_size(1 << iommu_bits)}), and libvirt "
            f"{dotted(versions.libvirt)} cannot lower the guest's bits: "
            "DMA mapping would fail"
        )
    if need:
        say.append(
            f"64-bit prefetchable BARs need {format_size(need)} packed largest first "
            f"(aligned to {format_size(alignment)}) over {len([c for c in bars if c.high])} root port(s)"
        )
    window, limit, x_mib = _window(need, bits, cpu_vendor, memory_mib, versions, say)
    if need and window.end > limit:
        raise LayoutRefused(
            f"the cards' 64-bit BARs need {format_size(need)}; with {format_size(memory_mib * MIB)} of RAM "
            f"OVMF puts a {format_size(window.size)} window at {window.base:#x}..{window.end:#x}, "
            f"above the guest's address limit 2^{limit.bit_length() - 1} = {format_size(limit)} "
            f"(host CPU {host_bits if host_bits else 'unknown'} bits, IOMMU "
            f"{iommu_bits if iommu_bits else 'unknown'} bits)"
        )
    if need:
        # (when OVMF picks its dynamic window over X, X's classic placement would end
        # below base + 2^(bits-3) < 2^bits too: an older firmware than assumed still fits)
        say.append(
            f"OVMF's {window.how} window {window.base:#x}..{window.end:#x} "
            f"({format_size(window.size)}) ends within the guest's limit {format_size(limit)} "
            f"(2^{limit.bit_length() - 1})"
        )
    via, hole = _fwcfg_route(x_mib, need, versions, say)
    if low:
        say.append(f"{format_size(low)} of BARs stay below 4 GiB")
    return Layout(
        need=need,
        alignment=alignment,
        low=low,
        guest_bits=bits,
        maxphysaddr=maxphys,
        window=window,
        address_limit=limit,
        fwcfg_mib=x_mib,
        fwcfg_via=via,
        pcihole64_kib=hole,
        versions=versions,
        decisions=tuple(say),
    )
