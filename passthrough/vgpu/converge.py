# SPDX-License-Identifier: Apache-2.0
"""A vGPU layout wanted on a host (the host role's ``passthrough_host_vgpu_layout``) brought
about: each card compared with what it holds now, planned where it holds no vGPU yet and
applied through the journal as ``passthrough vgpu apply`` applies it. A card that already
holds the layout is left alone (reported unchanged, so a second run changes nothing); a card
holding another layout is refused: it is taken back first (``state: absent`` or ``passthrough
vgpu undo``). A card that holds nothing but whose recorded layout is the one wanted (after a
reboot the boot unit did not re-apply) gets that record re-applied as the unit would (``vgpu
restore``), never a second layout on top of the record. Every card is planned before any is
touched, so a bad entry changes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.vgpu.apply import SHM, Say, Tool, VgpuFailed, apply_layout
from passthrough.vgpu.discover import NVIDIA_SMI, SRIOV_MANAGE, read_vgpu
from passthrough.vgpu.layoutfile import parse_layout
from passthrough.vgpu.model import VgpuCard, short_name
from passthrough.vgpu.plan import LayoutRefused, VgpuPlan, find_card, plan_layout
from passthrough.vgpu.unit import read_layout, restore


@dataclass
class CardLayout:
    """One card of the wanted layout: in place already (``plan`` None) or to be made."""

    card: VgpuCard
    type_name: str  # as people write it: L40S-12Q
    count: int
    plan: VgpuPlan | None = None
    vfs: list[str] = field(default_factory=list)  # where its vGPUs are (or will be)
    state: str = "unchanged"  # unchanged | planned | applied | restore | restored
    transaction: str | None = None

    def to_json(self) -> dict[str, Any]:
        mode = self.plan.mode if self.plan is not None else self.card.mode
        out: dict[str, Any] = {
            "card": str(self.card.address),
            "mode": mode.value,
            "type": self.type_name,
            "count": self.count,
            "vfs": self.vfs,
            "state": self.state,
        }
        if self.plan is not None and self.plan.enable_vfs and not self.vfs:
            out["enable_vfs"] = True  # its VFs are picked once sriov-manage has made them
        if self.transaction is not None:
            out["transaction"] = self.transaction
        return out


def held(card: VgpuCard) -> dict[str, list[str]]:
    """The vGPUs the card holds now: type name → the VF (or parent) of each."""
    out: dict[str, list[str]] = {}
    for vf in card.vfs:
        if vf.type_id:
            name = short_name(vf.type_name or f"id {vf.type_id}")
            out.setdefault(name, []).append(str(vf.address))
        for m in vf.mdevs:
            name = short_name(m.type_name or f"nvidia-{m.type_id}")
            out.setdefault(name, []).append(str(vf.address))
    return out


def recorded(entry: Any) -> dict[str, list[str]]:
    """A card's recorded layout (``read_layout``'s entry): type name → the VF of each."""
    out: dict[str, list[str]] = {}
    for v in entry.get("vgpus", []) if isinstance(entry, dict) else []:
        if isinstance(v, dict):
            name = short_name(str(v.get("type_name") or f"id {v.get('type_id')}"))
            out.setdefault(name, []).append(str(v.get("vf")))
    return out


def _not_in_place(card: VgpuCard, entry: Any, want: str, count: int) -> CardLayout:
    """A card holding nothing whose layout is on record: the record re-applied where it is
    the one wanted; refused where it is another (taken back first)."""
    rec = recorded(entry)
    if len(rec) == 1:
        ((name, vfs),) = rec.items()
        if name.casefold() == want.casefold() and len(vfs) == count:
            return CardLayout(card, name, count, None, vfs, "restore")
    holds = ", ".join(f"{len(v)} {k}" for k, v in sorted(rec.items())) or "no vGPU"
    raise LayoutRefused(
        f"{card.address}: its recorded layout ({holds}) is not in place (the boot unit did not "
        f"re-apply it: `passthrough vgpu verify` says what is missing) and is not {count} "
        f"{want}: take that layout back first (passthrough_host_state: absent, or passthrough "
        "vgpu undo)"
    )


def plan_host(root: HostRoot, layout: Any, where: str) -> list[CardLayout]:
    """Each card of ``layout`` (card address → {TYPE: COUNT}) against what it holds; a
    LayoutRefused naming ``where`` and the problem where one cannot take it."""
    wanted = parse_layout(layout, where)
    cards = read_vgpu(root, discover(root))
    out: list[CardLayout] = []
    try:
        try:
            records = read_layout(root)
        except ValueError as exc:
            raise LayoutRefused(str(exc)) from None
        for address, wants, mixed in wanted:
            card = find_card(cards, address)
            if mixed or len(wants) > 1:
                raise LayoutRefused(
                    f"{card.address}: heterogeneous layouts are applied by `passthrough vgpu "
                    "apply --layout`, not by the host role yet: one type per card here"
                )
            ((type_name, count),) = wants
            if any(c.card.address == card.address for c in out):
                raise LayoutRefused(f"{card.address} is named twice")
            want = short_name(type_name)
            now = held(card)
            if not now and str(card.address) in records:
                out.append(_not_in_place(card, records[str(card.address)], want, count))
                continue
            if not now:
                plan = plan_layout(card, type_name, count)
                vfs = [str(p.vf) for p in plan.placements]
                out.append(CardLayout(card, plan.type_name, count, plan, vfs, "planned"))
                continue
            ((name, vfs),) = now.items() if len(now) == 1 else ((None, []),)
            if name is not None and name.casefold() == want.casefold() and len(vfs) == count:
                out.append(CardLayout(card, name, count, None, vfs))
                continue
            holds = ", ".join(f"{len(v)} {k}" for k, v in sorted(now.items()))
            raise LayoutRefused(
                f"{card.address} holds {holds}, not {count} {want}: take that layout back first "
                "(passthrough_host_state: absent, or passthrough vgpu undo)"
            )
    except LayoutRefused as exc:
        raise LayoutRefused(f"{where}: {exc}") from None
    return out


def apply_host(
    root: HostRoot,
    layouts: list[CardLayout],
    *,
    tool: Tool | None,
    unit_command: str,
    say: Say = lambda _m: None,
) -> list[str]:
    """The planned cards applied, each its own transaction (the ids, in order); a card that
    fails names the cards applied before it (``passthrough vgpu undo`` takes them back)."""
    done: list[str] = []
    if any(e.state == "restore" for e in layouts):
        failed = restore_from_record(root, tool, say)
        if failed:
            raise VgpuFailed(f"re-applying the recorded vGPU layout: {'; '.join(failed)}")
        for entry in layouts:
            if entry.state == "restore":
                entry.state = "restored"
    for entry in layouts:
        if entry.plan is None:
            continue
        try:
            applied = apply_layout(root, entry.plan, tool=tool, say=say, unit_command=unit_command)
        except VgpuFailed as exc:
            before = [str(e.card.address) for e in layouts if e.state == "applied"]
            if before:
                exc.message += f"; applied before it: {', '.join(before)} (undo takes them back)"
            raise
        entry.vfs = [str(p.vf) for p in applied.placements]
        entry.state, entry.transaction = "applied", applied.tx.id
        done.append(applied.tx.id)
    return done


def restore_from_record(root: HostRoot, tool: Tool | None, say: Say) -> list[str]:
    """The recorded layout re-applied with the host's own tools, as the boot unit does
    (``passthrough vgpu restore``): what failed, each said too."""

    def ran(path: str, *argv: str) -> str | None:
        if tool is None:
            return f"{path.rsplit('/', 1)[-1]} is not run on this root (--run-root-tools)"
        r = tool([root.real(path), *argv])
        if r.returncode == 0:
            return None
        return (r.stderr or r.stdout).strip()[-200:] or f"exit {r.returncode}"

    from passthrough.journal.devices import poke

    try:
        return restore(
            root,
            lambda pf: ran(SRIOV_MANAGE, "-e", pf),
            lambda rel, value: poke(root, rel, value),
            say,
            heterogeneous=lambda pf: ran(NVIDIA_SMI, *SHM, "1", "-i", pf),
        )
    except ValueError as exc:
        raise VgpuFailed(str(exc)) from None
