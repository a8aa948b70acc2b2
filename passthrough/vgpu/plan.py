# SPDX-License-Identifier: Apache-2.0
"""A vGPU layout (a card, a type by name, a count) checked against what the card offers,
and the VFs (or mdev parents) it goes to. Nothing here writes."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from passthrough.errors import InvalidPciAddress, PassthroughError
from passthrough.model import PciAddress
from passthrough.vgpu.model import Mode, VgpuCard, VgpuType, short_name


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
    type_name: str
    count: int
    enable_vfs: bool = False  # sriov-manage -e first; the VFs are picked once they exist
    placements: list[Placement] = field(default_factory=list)

    @property
    def mode(self) -> Mode:
        return Mode.VENDOR_VFIO if self.enable_vfs else self.card.mode

    def to_json(self) -> dict[str, Any]:
        return {
            "card": str(self.card.address),
            "mode": self.mode.value,
            "type": self.type_name,
            "count": self.count,
            "enable_vfs": self.enable_vfs,
            "vgpus": [p.to_json() for p in self.placements],
        }

    def lines(self) -> list[str]:
        out = []
        if self.enable_vfs:
            out.append(
                f"enable the VFs of {self.card.address}: /{self.card.sriov_manage} -e {self.card.address}"
            )
        for p in self.placements:
            what = f"mdev {p.uuid} of type nvidia-{p.type_id}" if p.uuid else f"type {p.type_id}"
            out.append(f"{p.vf}: {what} ({p.type_name})")
        if self.enable_vfs:
            out.append(f"then {self.count} free VFs get {self.type_name}, read back one by one")
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
    if count < 1:
        raise LayoutRefused(f"--count {count}: at least 1")
    _refuse_busy(card)
    if card.mode is Mode.NONE:
        if card.total_vfs and not card.vfs and card.sriov_manage and card.driver == "nvidia":
            # the catalog is on the VFs: the type is checked once they exist
            return VgpuPlan(card, short_name(type_name), count, enable_vfs=True)
        raise LayoutRefused(f"{card.address}: no vGPU: {card.why}")
    chosen = find_type(card.types(), type_name, card)
    plan = VgpuPlan(card, chosen.short, count)
    plan.placements = pick(card, chosen, count)
    return plan


def pick(card: VgpuCard, chosen: VgpuType, count: int) -> list[Placement]:
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

        slots = [vf.address for vf in card.vfs if vf.free and any(fits(t) for t in vf.catalog)]
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
