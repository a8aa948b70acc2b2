# SPDX-License-Identifier: Apache-2.0
"""A vGPU layout (a card, a type by name, a count) checked against what the card offers,
and the VFs (or mdev parents) it goes to. Nothing here writes."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from passthrough.errors import InvalidPciAddress, PassthroughError
from passthrough.model import PciAddress
from passthrough.vgpu.model import Mode, VgpuCard, VgpuType, framebuffer_gb, short_name


class LayoutRefused(PassthroughError):
    """Bad input or a card that cannot take the layout: exit 2, nothing changed."""


@dataclass
class Placement:
    vf: PciAddress  # the VF, or the card itself (mdev on the PF)
    type_id: int
    type_name: str
    uuid: str | None = None  # mdev modes

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"vf": str(self.vf), "type_id": self.type_id}
        out["type_name"] = self.type_name
        if self.uuid:
            out["uuid"] = self.uuid
        return out


@dataclass
class VgpuPlan:
    card: VgpuCard
    wants: list[tuple[str, int]]  # (type name, count), in the layout's order
    enable_vfs: bool = False  # sriov-manage -e first; the VFs are picked once they exist
    placements: list[Placement] = field(default_factory=list)
    heterogeneous: bool = False  # nvidia-smi vgpu -shm 1 before the first type write

    @property
    def type_name(self) -> str:
        return ", ".join(name for name, _ in self.wants)

    @property
    def count(self) -> int:
        return sum(n for _, n in self.wants)

    @property
    def mode(self) -> Mode:
        return Mode.VENDOR_VFIO if self.enable_vfs else self.card.mode

    @property
    def set_heterogeneous(self) -> bool:
        """Whether apply sets the mode (not when the card shows it on already)."""
        return self.heterogeneous and self.card.heterogeneous is not True

    def to_json(self) -> dict[str, Any]:
        return {
            "card": str(self.card.address),
            "mode": self.mode.value,
            "type": self.type_name,
            "count": self.count,
            "types": dict(self.wants),
            "heterogeneous": self.heterogeneous,
            "enable_vfs": self.enable_vfs,
            "vgpus": [p.to_json() for p in self.placements],
        }

    def lines(self) -> list[str]:
        out = []
        pf = self.card.address
        if self.enable_vfs:
            out.append(f"enable the VFs of {pf}: /{self.card.sriov_manage} -e {pf}")
        if self.set_heterogeneous:
            out.append(
                f"set heterogeneous mode on {pf}: /{self.card.nvidia_smi} vgpu -shm 1 -i {pf}"
            )
        for p in self.placements:
            what = f"mdev {p.uuid} of type nvidia-{p.type_id}" if p.uuid else f"type {p.type_id}"
            out.append(f"{p.vf}: {what} ({p.type_name})")
        if self.enable_vfs:
            what = " and ".join(f"{n} {name}" for name, n in self.wants)
            out.append(f"then free VFs get {what}, read back one by one")
        return out


def find_card(cards: tuple[VgpuCard, ...], address: str) -> VgpuCard:
    try:
        wanted = PciAddress.parse(address)
    except (ValueError, InvalidPciAddress):
        raise LayoutRefused(f"--card {address!r}: not a PCI address (e.g. 0000:41:00.0)") from None
    for card in cards:
        if card.address == wanted:
            return card
    known = ", ".join(str(c.address) for c in cards) or "none"
    raise LayoutRefused(f"--card {wanted}: no NVIDIA card there (NVIDIA cards: {known})")


def find_type(types: tuple[VgpuType, ...], name: str, card: VgpuCard) -> VgpuType:
    """A type by its name as people write it (``L40S-12Q`` or ``NVIDIA L40S-12Q``)."""
    want = short_name(name).casefold()
    for t in types:
        if t.short.casefold() == want:
            return t
    offered = ", ".join(t.short for t in types) or "none (every VF is configured or none is free)"
    raise LayoutRefused(
        f"--type {name!r}: {card.address} offers no such type; it offers: {offered}"
    )


def _refuse_busy(card: VgpuCard) -> None:
    guests = card.guests()
    if guests:
        raise LayoutRefused(
            f"{card.address}: vGPU guest(s) running on it ({', '.join(guests)}): stop them first "
            "(a changed layout under a running guest is not taken)"
        )


def plan_layout(card: VgpuCard, type_name: str, count: int) -> VgpuPlan:
    return plan_card(card, [(type_name, count)])


def plan_card(
    card: VgpuCard, wants: list[tuple[str, int]], heterogeneous: bool = False
) -> VgpuPlan:
    """The plan of one card's layout: one type, or several with ``heterogeneous``."""
    for name, count in wants:
        if count < 1:
            raise LayoutRefused(
                f"--count {count}: at least 1" + (f" ({name})" if len(wants) > 1 else "")
            )
    if len(wants) > 1 and not heterogeneous:
        raise LayoutRefused(
            f"{card.address}: several types on one card need heterogeneous mode "
            "('heterogeneous: true' in the layout): a card holds one framebuffer size until it is set"
        )
    _refuse_busy(card)
    if heterogeneous:
        refuse_heterogeneous(card)
    if card.mode is Mode.NONE:
        if card.total_vfs and not card.vfs and card.sriov_manage and card.driver == "nvidia":
            # the catalog is on the VFs: the types are checked once they exist
            named = [(short_name(name), n) for name, n in wants]
            return VgpuPlan(card, named, enable_vfs=True, heterogeneous=heterogeneous)
        raise LayoutRefused(f"{card.address}: no vGPU: {card.why}")
    types = card.types()
    chosen = [(find_type(types, name, card), n) for name, n in wants]
    plan = VgpuPlan(card, [(t.short, n) for t, n in chosen], heterogeneous=heterogeneous)
    plan.placements = place_all(card, chosen, heterogeneous)
    return plan


def place_all(
    card: VgpuCard, chosen: list[tuple[VgpuType, int]], heterogeneous: bool
) -> list[Placement]:
    """Each wanted type placed on VFs no other type of the layout took; with heterogeneous
    mode, their framebuffer checked against the card's (the largest type's size)."""
    if heterogeneous:
        check_framebuffer(card, card.types(), chosen)
    out: list[Placement] = []
    for t, n in chosen:
        out += pick(card, t, n, taken={p.vf for p in out})
    return out


def replan(card: VgpuCard, plan: VgpuPlan) -> list[Placement]:
    """The placements again, on the card as it is now (its VFs enabled, its mode set)."""
    types = card.types()
    chosen = [(find_type(types, name, card), n) for name, n in plan.wants]
    return place_all(card, chosen, plan.heterogeneous)


def refuse_heterogeneous(card: VgpuCard) -> None:
    """Heterogeneous mode where passthrough cannot set it: refused in one line."""
    if card.mode not in (Mode.VENDOR_VFIO, Mode.NONE):
        raise LayoutRefused(
            f"{card.address}: heterogeneous mode is set on vendor-VFIO cards only (SR-IOV VFs "
            f"with nvidia/current_vgpu_type); this card is {card.mode.value}"
        )
    if card.nvidia_smi is None:
        raise LayoutRefused(
            f"{card.address}: heterogeneous mode is set with nvidia-smi, and /usr/bin/nvidia-smi "
            "is not there (is this NVIDIA's vGPU host driver?)"
        )
    held = [f"{vf.address} {vf.type_name or vf.type_id}" for vf in card.vfs if vf.type_id]
    if held and card.heterogeneous is not True:
        raise LayoutRefused(
            f"{card.address}: holds vGPUs already ({', '.join(held)}): heterogeneous mode is set "
            "before the first type write; take them back first (`passthrough vgpu undo`)"
        )


def check_framebuffer(
    card: VgpuCard, types: tuple[VgpuType, ...], chosen: list[tuple[VgpuType, int]]
) -> None:
    sizes = [framebuffer_gb(t.name) for t, _ in chosen]
    whole = max((framebuffer_gb(t.name) or 0 for t in types), default=0)
    held = sum(framebuffer_gb(vf.type_name or "") or 0 for vf in card.vfs if vf.type_id)
    if not whole or None in sizes:
        return  # sizes not told by the names: the driver's read-back decides
    asked = sum((size or 0) * n for size, (_, n) in zip(sizes, chosen, strict=True))
    if asked + held > whole:
        what = " + ".join(f"{n} x {t.short}" for t, n in chosen)
        raise LayoutRefused(
            f"{card.address}: {what} is {asked} GB of framebuffer"
            + (f" (and {held} GB held)" if held else "")
            + f"; the card has {whole} GB"
        )


def pick(
    card: VgpuCard, chosen: VgpuType, count: int, taken: set[PciAddress] | None = None
) -> list[Placement]:
    """The VFs (or mdev instances) the layout goes to; refused when the card has too few."""
    if card.mode is Mode.MDEV_PF:
        vf = card.vfs[0]
        offer = next((t for t in vf.catalog if t.id == chosen.id), chosen)
        room = offer.available or 0
        slots = [vf.address] * min(count, room)
    else:
        # one vGPU a VF: the free VFs whose catalog still lists the type
        def fits(t: VgpuType) -> bool:
            return t.id == chosen.id and (t.available is None or t.available > 0)

        slots = [
            vf.address
            for vf in card.vfs
            if vf.free and vf.address not in (taken or set()) and any(fits(t) for t in vf.catalog)
        ]
        room = len(slots)
    if room < count:
        raise LayoutRefused(
            f"{card.address}: room for {room} more {chosen.short}, not {count} "
            f"({sum(1 for v in card.vfs if v.free)} free VFs of {len(card.vfs)})"
        )
    mdev = card.mode in (Mode.MDEV_VF, Mode.MDEV_PF)
    return [
        Placement(vf, chosen.id, chosen.name, str(uuidlib.uuid4()) if mdev else None)
        for vf in slots[:count]
    ]
