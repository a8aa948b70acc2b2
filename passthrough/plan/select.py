"""Which cards go to vfio-pci, and the refusals that protect the host."""

from __future__ import annotations

import re
from dataclasses import dataclass

from passthrough.errors import PassthroughError, quote
from passthrough.model import BMC_VGA_VENDORS, NVIDIA, GpuVerdict, Host, PciAddress, PciFunction

ID_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$")


class SelectionRefused(PassthroughError):
    """Nothing is written: the selection would harm the host or cannot work."""


@dataclass(frozen=True)
class Selection:
    cards: list[GpuVerdict]
    functions: list[PciFunction]  # every function that goes to vfio-pci (cards + group extras)
    vfio_ids: list[str]
    ids_ambiguous: bool  # some kept device shares an ID: bind per device instead
    boot_gpu: bool
    notes: list[str]


def _match(verdicts: list[GpuVerdict], token: str) -> list[GpuVerdict]:
    if ID_RE.match(token):
        return [v for v in verdicts if token.lower() in {f.id for f in v.gpu.functions}]
    try:
        address = PciAddress.parse(token)
    except PassthroughError:
        raise SelectionRefused(
            f"--gpu {quote(token)}: neither a PCI address (0000:01:00.0) nor a vendor:device ID (10de:2684)"
        ) from None
    return [v for v in verdicts if address in {f.address for f in v.gpu.functions}]


def select(
    host: Host,
    verdicts: list[GpuVerdict],
    gpus: list[str],
    include_group: bool = False,
    allow_boot_gpu: bool = False,
) -> Selection:
    if gpus:
        chosen: list[GpuVerdict] = []
        for token in gpus:
            found = _match(verdicts, token)
            if not found:
                raise SelectionRefused(
                    f"--gpu {token}: matches no GPU on this host (see `passthrough scan`)"
                )
            for v in found:
                if v not in chosen:
                    chosen.append(v)
    else:
        chosen = [v for v in verdicts if v.gpu.primary.vendor_id == NVIDIA and v.viable]
        if not chosen:
            raise SelectionRefused(
                "no viable NVIDIA GPU on this host; name cards with --gpu (see `passthrough scan`)"
            )
    by_addr = {f.address: f for f in host.functions}
    critical = set(host.critical.root_pci) | set(host.critical.nic_pci)
    notes: list[str] = []
    functions: dict[PciAddress, PciFunction] = {}
    for v in chosen:
        p = v.gpu.primary
        if p.vendor_id in BMC_VGA_VENDORS:
            raise SelectionRefused(
                f"{p.address}: server management VGA ({BMC_VGA_VENDORS[p.vendor_id]}) is the host console; never passed through"
            )
        for f in v.gpu.functions:
            functions[f.address] = f
    for v in chosen:
        p = v.gpu.primary
        if not host.groups:
            notes.append(
                f"{p.address}: IOMMU groups are unknown until the IOMMU is on; run `passthrough scan` after the reboot"
            )
            continue
        for addr in v.group_members:
            member = by_addr.get(addr)
            if member is None or member.is_bridge_like or addr in functions:
                continue
            if addr in critical:
                what = (
                    "root-disk controller"
                    if addr in host.critical.root_pci
                    else "default-route NIC"
                )
                raise SelectionRefused(
                    f"{p.address}: its IOMMU group holds the host's {what} {addr}; binding it would cut the "
                    "host off — move the card to another slot"
                )
            if (
                member.is_display
                and member.address.slot not in {c.gpu.address.slot for c in chosen}
                and not include_group
            ):
                raise SelectionRefused(
                    f"{p.address}: its IOMMU group also holds the GPU {addr}; select both (--gpu) or use --include-group"
                )
            if not include_group:
                raise SelectionRefused(
                    f"{p.address}: its IOMMU group also holds {addr} ({member.name}); "
                    "--include-group hands the whole group to the guest knowingly"
                )
            functions[addr] = member
            notes.append(
                f"{addr} ({member.name}) goes to vfio-pci with the group of {p.address} (--include-group)"
            )
    boot = [v for v in chosen if v.gpu.primary.boot_vga]
    if boot and not allow_boot_gpu:
        raise SelectionRefused(
            f"{boot[0].gpu.address} is the boot VGA (the host console draws on it); --allow-boot-gpu takes it knowingly"
        )
    selected = sorted(functions.values(), key=lambda f: f.address)
    ids: list[str] = []
    for f in selected:
        if f.id not in ids:
            ids.append(f.id)
    kept = [f for f in host.functions if f.address not in functions and f.id in ids]
    if kept:
        notes.append(
            "the host keeps "
            + ", ".join(f"{f.address} ({f.id})" for f in kept)
            + " with the same IDs: binding per device (driver_override) instead of vfio-pci.ids"
        )
    return Selection(
        cards=chosen,
        functions=selected,
        vfio_ids=ids,
        ids_ambiguous=bool(kept),
        boot_gpu=bool(boot),
        notes=notes,
    )
