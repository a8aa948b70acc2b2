# SPDX-License-Identifier: Apache-2.0
"""The address-space check of a hand-written domain: the same firmware and CPU model as
the planner (layout.py), applied to XML someone else wrote (validate's "host" rules)."""

from __future__ import annotations

from collections.abc import Sequence

from passthrough.analysis.codes import (
    BITS_ABOVE_IOMMU,
    MMIO_ABOVE_LIMIT,
    MMIO_TOO_SMALL,
    severity,
)
from passthrough.model import Finding, Host, PciFunction, Severity
from passthrough.units import MIB, format_size
from passthrough.vm.domxml import Domain
from passthrough.vm.layout import (
    DEVICE_ROOM,
    QEMU_DEFAULT_PHYS_BITS,
    QEMU_HOST_BITS_SINCE,
    X_PCIMMIO64,
    card_bars,
    firmware_window,
    pack,
    pow2_ceil,
)
from passthrough.vm.versions import Versions, host_versions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from passthrough.vm.xmlfield import Element


def _int(text: str | None) -> int | None:
    try:
        return int(text or "")
    except ValueError:
        return None


def _memory_mib(dom: Domain) -> int | None:
    size = dom.memory.bytes if dom.memory is not None else None
    return None if size is None else size // MIB


def _x_pcimmio64(dom: Domain) -> int | None:
    values = [e.value or "" for e in dom.fwcfg if e.name == X_PCIMMIO64]
    for arg in dom.qemu_args:
        a = arg.value or ""
        if f"name={X_PCIMMIO64}," in a:
            values.append(a.rpartition("string=")[2])
    sizes = [v for v in (_int(s.strip()) for s in values) if v is not None]
    return max(sizes) if sizes else None


def _guest_bits(dom: Domain, host: Host, versions: Versions) -> tuple[int, str]:
    addr = dom.cpu.maxphysaddr if dom.cpu is not None else None
    host_bits = host.cpu.phys_bits
    if addr is None:
        mode = dom.cpu.mode if dom.cpu is not None else None
        if (
            dom.type == "kvm"
            and mode in ("host-passthrough", "maximum")
            and host_bits
            and versions.qemu >= QEMU_HOST_BITS_SINCE
        ):
            return host_bits, "no <maxphysaddr>: QEMU gives -cpu host the host's bits"
        return QEMU_DEFAULT_PHYS_BITS, "no <maxphysaddr>: QEMU's default"
    if addr.mode == "emulate":
        bits = addr.bits
        if bits is not None:
            return bits, "<maxphysaddr mode='emulate'>"
    if addr.mode == "passthrough" and host_bits:
        limit = addr.limit
        if limit is not None and limit < host_bits:
            return limit, "the host's bits, limited"
        return host_bits, "the host's bits"
    return QEMU_DEFAULT_PHYS_BITS, "unreadable <maxphysaddr>: QEMU's default"


def _by_guest_bus(dom: Domain, host: Host) -> dict[int, list[PciFunction]]:
    """The host's functions the domain passes, by the guest bus each sits on."""
    by_bus: dict[int, list[PciFunction]] = {}
    for hd in dom.pci_hostdevs:
        src = hd.source
        fn = host.function(src) if src is not None else None
        guest = hd.guest
        bus = guest.bus if guest is not None else None
        if fn is not None:
            by_bus.setdefault(bus if bus is not None else -1 - len(by_bus), []).append(fn)
    return by_bus


def _boots_ovmf(dom: Domain) -> bool:
    """UEFI firmware on q35: what builds a 64-bit MMIO window at all (SeaBIOS does not)."""
    loader = (dom.loader or "").lower()
    uefi = dom.firmware == "efi" or any(n in loader for n in ("ovmf", "edk2", "uefi"))
    return uefi and (dom.machine or "").startswith(("q35", "pc-q35"))


def window_sure(
    domain: Domain | Element, host: Host, found: Sequence[Finding], versions: Versions
) -> bool:
    """Whether the domain's 64-bit window surely holds its hostdevs' BARs, given what
    :func:`layout_findings` ``found`` with these ``versions``: no window finding, UEFI on
    q35, and either OVMF's version known (its own sizing relied on, as render relies on it)
    or a window the domain sets itself (``X-PciMmio64Mb``) large enough. With OVMF's version
    only a stand-in, render does not rely on OVMF's own sizing, and neither does this."""
    dom = Domain.of(domain)
    if not _boots_ovmf(dom):
        return False
    if any(f.code in (MMIO_TOO_SMALL, MMIO_ABOVE_LIMIT) for f in found):
        return False
    if not versions.is_assumed("ovmf"):
        return True
    need, _ = pack(card_bars(fns) for fns in _by_guest_bus(dom, host).values())
    x_mib = _x_pcimmio64(dom)
    return x_mib is not None and x_mib * MIB >= need + DEVICE_ROOM


def layout_findings(
    domain: Domain | Element, host: Host, versions: Versions | None = None
) -> list[Finding]:
    """Check a domain (a :class:`Domain`, or an lxml ``<domain>`` element) against this host: can
    the window OVMF will build hold its hostdevs' BARs, below the guest's address limit and
    within what the host IOMMU maps? Codes: ``mmio-window-too-small``,
    ``mmio-window-above-limit``, ``guest-bits-above-iommu``."""
    if versions is None:
        versions = host_versions(host)
    dom = Domain.of(domain)
    out: list[Finding] = []
    by_bus = _by_guest_bus(dom, host)
    if not by_bus:
        return out
    devices = tuple(sorted(f.address for fns in by_bus.values() for f in fns))
    need, _ = pack(card_bars(fns) for fns in by_bus.values())
    bits, bits_why = _guest_bits(dom, host, versions)
    iommu = host.iommu.address_bits
    if iommu and bits > iommu:
        out.append(
            Finding(
                BITS_ABOVE_IOMMU,
                Severity(severity(BITS_ABOVE_IOMMU)),
                f"the guest addresses {bits} bits ({bits_why}) but the host IOMMU maps only "
                f"{iommu}: DMA mapping fails once anything sits above 2^{iommu} = "
                f"{format_size(1 << iommu)}; add <maxphysaddr> with {iommu} bits",
                devices,
            )
        )
    if not need:
        return out
    memory = _memory_mib(dom) or 0
    x_mib = _x_pcimmio64(dom)
    window, limit = firmware_window(bits, host.cpu.vendor, memory, versions.ovmf, x_mib)
    how = (
        f"{X_PCIMMIO64}={x_mib}"
        if x_mib and window.how == "classic"
        else f"OVMF's {window.how} window"
    )
    if need + DEVICE_ROOM > window.size:
        out.append(
            Finding(
                MMIO_TOO_SMALL,
                Severity(severity(MMIO_TOO_SMALL)),
                f"the hostdevs' 64-bit BARs need {format_size(need)} packed and the domain's "
                f"other devices {format_size(DEVICE_ROOM)}, but {how} gives "
                f"{format_size(window.size)} ({need} + {DEVICE_ROOM} > {window.size} bytes): "
                f"the guest sees BARs unassigned; set {X_PCIMMIO64} to at least "
                f"{pow2_ceil(need + DEVICE_ROOM) // MIB}",
                devices,
            )
        )
    elif window.end > limit:
        out.append(
            Finding(
                MMIO_ABOVE_LIMIT,
                Severity(severity(MMIO_ABOVE_LIMIT)),
                f"{how} puts {format_size(window.size)} at {window.base:#x}..{window.end:#x}, above "
                f"the guest's address limit 2^{limit.bit_length() - 1} = {format_size(limit)} "
                f"({bits} bits: {bits_why}; {format_size(memory * MIB)} of RAM)",
                devices,
            )
        )
    return out
