# SPDX-License-Identifier: Apache-2.0
"""The locked-memory limit of a guest's QEMU process, and whether the limits that apply
leave room for it.

A guest with VFIO devices pins all its RAM for DMA, so the QEMU process's ``RLIMIT_MEMLOCK``
must cover it (else ``VFIO_MAP_DMA`` fails and the guest does not start). libvirt sets that
limit itself when it starts QEMU; :func:`libvirt_limit` computes the value it sets, by the
rule of libvirt 9.0's ``qemuDomainGetMemLockLimitBytes`` (src/qemu/qemu_domain.c) and its
ppc64 helper ``getPPC64MemLockLimitBytes``:

- ``<memtune><hard_limit>`` set: that value, whatever the devices need;
- ``<memoryBacking><locked/>``: no limit at all;
- a ppc64 KVM guest: the pSeries rule (hash table, DMA windows per PCI host bridge);
- else, with VFIO/mdev hostdevs, NVMe disks or vDPA interfaces: ``factor`` × the guest's
  memory + 1 GiB, where ``factor`` is the number of vDPA interfaces plus one for the VFIO
  devices, or plus one per VFIO device when the guest has a vIOMMU (each device then maps
  the whole RAM on its own);
- else nothing: QEMU keeps what it inherits from the daemon.

The guest's memory here is libvirt's "total memory": ``<memory>``, or, when that is absent,
the NUMA cells' memory plus the memory devices'.

The domain is read through :mod:`passthrough.vm.domxml`, as everything else reads it: a
container libvirt's schema allows once (``<devices>``, ``<memtune>``) is read where it first
stands, and a disk's backing chain is each layer's first ``<backingStore>``, as libvirt
follows it.

:func:`shortfalls` compares what the devices need (the VFIO rule, without the hard limit)
with what applies: the domain's ``hard_limit``, and the daemon's own ``LimitMEMLOCK`` where
the daemon cannot raise a child's limit above it (libvirt raises it with ``prlimit``, which
needs ``CAP_SYS_RESOURCE``: a unit with ``User=`` other than root or a
``CapabilityBoundingSet`` without it keeps QEMU under ``LimitMEMLOCK``, and the start fails
with "cannot limit locked memory").
"""

from __future__ import annotations

from collections.abc import Callable

from passthrough.analysis.codes import MEMLOCK_CAPPED, MEMLOCK_SHORT, severity
from passthrough.model import Finding, Host, LibvirtDaemon, PciAddress, Severity
from passthrough.records import frozen
from passthrough.units import GIB, KIB, format_size
from passthrough.vm.domxml import Domain, HostDev, Interface, Memory
from passthrough.vm.xmlfield import Element

# VIR_DOMAIN_MEMORY_PARAM_UNLIMITED (KiB): a hard_limit at or above it is "not set"
_UNLIMITED_KIB = 9007199254740991
_PPC64 = ("ppc64", "ppc64le")


def _kib(size: int | None) -> int:
    """libvirt keeps memory in KiB, rounded up (virDomainParseMemory)."""
    return 0 if size is None else -(-size // KIB)


def _size_kib(size: Memory | None) -> int:
    return 0 if size is None else _kib(size.bytes)


def total_memory_kib(dom: Domain) -> int:
    """virDomainDefGetMemoryTotal after post-parse: ``<memory>``, or the NUMA cells plus the
    memory devices where ``<memory>`` is absent or zero."""
    total = _size_kib(dom.memory)
    if total:
        return total
    cells = sum(_kib(c.bytes) for c in dom.cpu.numa_cells) if dom.cpu is not None else 0
    dimms = sum(_size_kib(m.size) for m in dom.memory_devices)
    return cells + dimms if cells else total


@frozen(slots=True)
class Devices:
    """What libvirt counts: VFIO (PCI vfio and mdev hostdevs, NVMe disks), vDPA, a vIOMMU."""

    vfio: int
    vdpa: int
    viommu: bool
    pci_hostdevs: tuple[tuple[PciAddress | None, bool], ...]  # (host address, guest-addressed)


def count_devices(dom: Domain) -> Devices:
    vfio = 0
    pci: list[tuple[PciAddress | None, bool]] = []
    # an <interface type='hostdev'> is a PCI hostdev too (libvirt adds it to the hostdevs)
    hostdevs: list[HostDev] = [
        *(h for h in dom.hostdevs if h.mode in (None, "subsystem")),
        *(i for i in dom.interfaces if i.type == "hostdev"),
    ]
    for h in hostdevs:
        kind = "pci" if isinstance(h, Interface) else h.type
        if kind == "mdev":
            vfio += 1
        # QEMU's default backend for a PCI hostdev is vfio (the legacy "kvm" one is refused)
        elif kind == "pci" and h.driver in (None, "vfio"):
            vfio += 1
            pci.append((h.source, h.placed is not None))
    vfio += sum(any(layer.type == "nvme" for layer in d.chain) for d in dom.disks)
    vdpa = sum(i.type == "vdpa" for i in dom.interfaces)
    return Devices(vfio, vdpa, dom.iommu is not None, tuple(pci))


@frozen(slots=True)
class Estimate:
    """The limit libvirt sets (``limit``: bytes; None: unlimited; 0: none set) and why
    (``source``), and what the devices need by libvirt's own rule without a hard limit or
    ``<locked/>`` (``need``, with its arithmetic in ``why``; 0: nothing is pinned)."""

    limit: int | None
    source: str  # "hard_limit" | "locked" | "devices" | "none"
    need: int
    why: str


def _ppc64_need(
    dom: Domain, devices: Devices, group_of: Callable[[PciAddress], int | None]
) -> tuple[int, str]:
    """getPPC64MemLockLimitBytes (libvirt 9.0), in bytes. NVLink2 GPUs (POWER9 with V100
    SXM2) are not recognised: they would raise the limit, never lower it."""
    memory = total_memory_kib(dom)
    max_memory = _size_kib(dom.max_memory) or memory
    roots = sum(c.type == "pci" and c.model == "pci-root" for c in dom.controllers)
    # On pSeries every host device is isolated by its host IOMMU group: libvirt gives each
    # group a PCI host bridge of its own (qemuDomainFillDeviceIsolationGroup) unless the
    # domain already places the devices (a dumped domain lists those bridges itself).
    groups = {
        group_of(a) if group_of(a) is not None else a
        for a, placed in devices.pci_hostdevs
        if a is not None and not placed
    }
    phbs = max(roots, 1) + len(groups)
    base = max_memory // 128 + 4096 * phbs + 8192
    passthrough = 0
    if devices.vfio or devices.vdpa:
        passthrough = max(2 * 1024 * 1024 * phbs, memory + memory // 512 * phbs + 8192)
    why = (
        f"pSeries: {format_size(max_memory * KIB)} maximum memory / 128 + 4 MiB × {phbs} PCI "
        "host bridge(s) + 8 MiB"
    )
    if passthrough:
        why += f", plus the VFIO DMA windows ({format_size(passthrough * KIB)})"
    return (base + passthrough) * KIB, why


def libvirt_limit(
    doc: Domain | Element, group_of: Callable[[PciAddress], int | None] | None = None
) -> Estimate:
    """The RLIMIT_MEMLOCK libvirt sets for the domain ``doc`` (a :class:`Domain`, or an lxml
    ``<domain>``), by qemuDomainGetMemLockLimitBytes (libvirt 9.0). ``group_of`` gives a
    host function's IOMMU group (pSeries isolation); without it each device counts as its
    own group."""
    dom = Domain.of(doc)
    devices = count_devices(dom)
    if dom.arch in _PPC64 and dom.type == "kvm":
        need, why = _ppc64_need(dom, devices, group_of or (lambda a: None))
    elif devices.vfio or devices.vdpa:
        factor = devices.vdpa
        if devices.vfio:
            factor += devices.vfio if devices.viommu else 1
        memory = total_memory_kib(dom) * KIB
        need = factor * memory + GIB
        per = (
            f"{devices.vfio} VFIO device(s) behind a vIOMMU"
            if devices.viommu and devices.vfio > 1
            else None
        )
        why = f"{format_size(memory)} guest memory × {factor}"
        why += f" ({per})" if per else ""
        why += " + 1 GiB"
    else:
        need, why = 0, "no VFIO or vDPA device: libvirt leaves the limit as inherited"
    hard = _size_kib(dom.hard_limit)
    if hard and hard < _UNLIMITED_KIB:
        return Estimate(hard * KIB, "hard_limit", need, why)
    if dom.locked is not None:
        return Estimate(None, "locked", need, why)
    return Estimate(need, "devices" if need else "none", need, why)


def _gib(size: int) -> str:
    return f"{size / GIB:.2f}".rstrip("0").rstrip(".") + " GiB"


@frozen(slots=True)
class Shortfall:
    message: str
    element: str  # where in the domain it is about: "memtune/hard_limit" or "devices"
    code: str = MEMLOCK_SHORT


def shortfalls(estimate: Estimate, daemons: tuple[LibvirtDaemon, ...] = ()) -> list[Shortfall]:
    """Where the limits that apply leave less than the devices need, each with its
    arithmetic (GiB). Nothing when the guest pins nothing."""
    if not estimate.need:
        return []
    out: list[Shortfall] = []
    need = f"{_gib(estimate.need)} needed ({estimate.why}, libvirt's rule)"
    hard = estimate.limit if estimate.source == "hard_limit" else None
    if hard is not None and hard < estimate.need:
        message = (
            f"<memtune><hard_limit> {_gib(hard)} is the QEMU process's locked-memory limit: "
            f"{_gib(estimate.need - hard)} short of {need}; raise hard_limit or remove it"
        )
        out.append(Shortfall(message, "memtune/hard_limit"))
    for d in daemons:
        applied = estimate.limit
        if d.can_raise or d.memlock is None or (applied is not None and applied <= d.memlock):
            continue
        wanted = "no limit (<locked/>)" if applied is None else _gib(applied)
        gap = "" if applied is None else f", {_gib(applied - d.memlock)} short"
        # <locked/> asks for no limit at all: only infinity (or the capability) serves
        to = "infinity" if applied is None else f"at least {_gib(applied)}"
        message = (
            f"{d.unit} runs {d.why_capped}, so it cannot raise QEMU's locked-memory limit "
            f"above its LimitMEMLOCK={d.memlock_text} ({_gib(d.memlock)}, {d.memlock_from}) "
            f"to {wanted}{gap} ({need}): the guest would not start; set LimitMEMLOCK={to} in "
            f"a drop-in ({d.unit}.d/*.conf), or let it keep CAP_SYS_RESOURCE as root"
        )
        out.append(Shortfall(message, "devices", MEMLOCK_CAPPED))
    return out


def daemons_in_use(host: Host) -> tuple[LibvirtDaemon, ...]:
    """The libvirt daemons whose limits apply: the enabled ones, or every one found."""
    enabled = tuple(d for d in host.libvirt_daemons if d.enabled)
    return enabled or host.libvirt_daemons


def check(doc: Domain | Element, host: Host | None) -> list[tuple[Finding, str]]:
    """``memlock-short`` warnings and ``memlock-capped`` errors for the domain ``doc``
    (against the host's daemons when a host is given), each with the element it is about."""

    def group_of(a: PciAddress) -> int | None:
        f = host.function(a) if host is not None else None
        return f.iommu_group if f is not None else None

    estimate = libvirt_limit(doc, group_of)
    daemons = daemons_in_use(host) if host is not None else ()
    return [
        (Finding(s.code, Severity(severity(s.code)), s.message), s.element)
        for s in shortfalls(estimate, daemons)
    ]
