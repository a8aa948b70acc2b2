# SPDX-License-Identifier: Apache-2.0
"""A Plan: ordered actions plus whether a reboot is needed. Shown, then applied.

The same Plan feeds ``passthrough plan`` (diffs, commands, JSON), Ansible's check mode
and ``passthrough apply``; re-planning an applied host gives a plan without actions.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from passthrough.host.root import HostRoot
from passthrough.kargs import ArgChange, describe
from passthrough.model import BootloaderKind, InitramfsKind
from passthrough.records import frozen


@frozen
class WriteFile:
    """A file the plan writes (atomically, with a backup of what was there)."""

    path: str  # relative to the root
    content: bytes
    why: str
    # The mode of a file apply creates (its owner: whoever runs apply). A file apply
    # rewrites keeps its own mode, owner, group and extended attributes, whatever this says.
    mode: int = 0o644


@frozen
class RemoveFile:
    """A file the plan removes (backed up first)."""

    path: str
    why: str


@frozen
class Run:
    """A command the plan runs after its files are written (update-grub, update-initramfs)."""

    argv: tuple[str, ...]
    why: str
    # Files the command may change (globs, relative to the root). Never backed up: they are
    # generated, and a kernel update between apply and undo makes their old bytes wrong.
    touches: tuple[str, ...] = ()
    # For tools that edit what they own (rpm-ostree deployments, grubby's BLS entries,
    # kernelstub): the inverse command, which undo runs.
    undo_argv: tuple[str, ...] | None = None
    # Regeneration (update-grub, update-initramfs, ...) is run again after an undo.
    regenerate: bool = False


Action = WriteFile | RemoveFile | Run


class Binding(StrEnum):
    """How the planned functions reach vfio-pci at boot."""

    IDS = "ids"  # vfio-pci.ids=vendor:device, when those IDs name only the chosen cards
    DRIVER_OVERRIDE = "driver_override"  # a udev rule per address, when they would take more


@frozen
class PlannedCard:
    """A card the plan binds to vfio-pci, with its functions."""

    address: str
    name: str
    functions: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "name": self.name, "functions": list(self.functions)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlannedCard:
        return cls(
            address=str(d["address"]),
            name=str(d.get("name", "")),
            functions=tuple(map(str, d.get("functions") or [])),
        )


@frozen
class PlanRecord:
    """What the journal keeps of an applied plan, for verify (and the VM module's check
    that a card was handed over). Its JSON is the same object journals v1 (inline in the
    transaction) and v2 (under ``record``) stored, so older journals read as they are."""

    cards: tuple[PlannedCard, ...]
    functions: tuple[str, ...]
    kernel_args: ArgChange  # what the next boot must have: the target, not the edit
    binding: Binding
    bootloader: BootloaderKind
    # the vfio driver of each function, where it is a variant (absent: vfio-pci)
    drivers: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cards": [c.to_json() for c in self.cards],
            "functions": list(self.functions),
            "kernel_args": self.kernel_args.to_json(),
            "binding": self.binding.value,
            "bootloader": self.bootloader.value,
        }
        if self.drivers:
            out["vfio_drivers"] = dict(self.drivers)
        return out

    def driver(self, address: str) -> str:
        return self.drivers.get(address, "vfio-pci")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanRecord:
        return cls(
            cards=tuple(PlannedCard.from_json(c) for c in d.get("cards") or []),
            functions=tuple(map(str, d.get("functions") or [])),
            kernel_args=ArgChange.from_json(d.get("kernel_args") or {}),
            # the binding and bootloader have been recorded since the first journal;
            # a record without them is read as the planner's defaults
            binding=Binding(d.get("binding", Binding.IDS.value)),
            bootloader=BootloaderKind(d.get("bootloader", BootloaderKind.UNKNOWN.value)),
            drivers={str(k): str(v) for k, v in (d.get("vfio_drivers") or {}).items()},
        )


@dataclass
class Plan:
    """Every change one apply makes to a root, and whether a reboot is due."""

    root: str
    actions: list[Action]
    reboot: bool
    kernel_args: ArgChange  # the edit the actions make
    cards: list[PlannedCard]
    bootloader: BootloaderKind
    initramfs: InitramfsKind
    binding: Binding
    target_args: ArgChange = field(default_factory=ArgChange)  # what the next boot must have
    functions: list[str] = field(default_factory=list)  # addresses that go to vfio-pci
    notes: list[str] = field(default_factory=list)
    drivers: dict[str, str] = field(default_factory=dict)  # the vfio driver of each function
    # the policy's warnings on the cards (scan's, render's): among the notes, and told by apply
    warnings: list[str] = field(default_factory=list)

    def record(self) -> PlanRecord:
        """What the journal keeps of this plan, for verify."""
        return PlanRecord(
            cards=tuple(self.cards),
            functions=tuple(self.functions),
            # the reasons are prose for the plan's text: the journal keeps only the change
            kernel_args=ArgChange(set=self.target_args.set, drop=self.target_args.drop),
            binding=self.binding,
            bootloader=self.bootloader,
            drivers={a: d for a, d in self.drivers.items() if d != "vfio-pci"},
        )

    @property
    def empty(self) -> bool:
        return not self.actions

    def to_json(self, root: HostRoot) -> dict[str, Any]:
        """``passthrough plan --json`` and the host module's ``plan`` (schema plan/v1)."""
        return {
            "schema": "passthrough.plan/v1",
            "root": self.root,
            "changed": not self.empty,
            "reboot_required": self.reboot,
            "bootloader": self.bootloader.value,
            "initramfs": self.initramfs.value,
            "binding": self.binding.value,
            "cards": [c.to_json() for c in self.cards],
            "functions": list(self.functions),
            "kernel_args": self.kernel_args.to_json(),
            "actions": [action_json(a, root) for a in self.actions],
            "notes": list(self.notes),
            "vfio_drivers": dict(self.drivers),
        }


def file_diff(root: HostRoot, action: WriteFile | RemoveFile) -> str:
    old = root.read_bytes(action.path)
    old_text = old.decode("utf-8", "replace") if old is not None else ""
    new_text = action.content.decode("utf-8", "replace") if isinstance(action, WriteFile) else ""
    return "".join(
        difflib.unified_diff(
            old_text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=f"a/{action.path}" if old is not None else "/dev/null",
            tofile=f"b/{action.path}" if isinstance(action, WriteFile) else "/dev/null",
        )
    )


def action_json(action: Action, root: HostRoot) -> dict[str, Any]:
    if isinstance(action, WriteFile | RemoveFile):
        kind = "write" if isinstance(action, WriteFile) else "remove"
        return {
            "kind": kind,
            "path": "/" + action.path,
            "why": action.why,
            "diff": file_diff(root, action),
        }
    return {"kind": "run", "argv": list(action.argv), "why": action.why}


def plan_text(plan: Plan, root: HostRoot) -> str:
    lines: list[str] = []
    cards = ", ".join(f"{c.address} ({c.name})" for c in plan.cards) or "none"
    lines.append(f"Cards for vfio-pci: {cards}")
    lines.append(
        f"Bootloader: {plan.bootloader} · initramfs: {plan.initramfs} · binding: {plan.binding}"
    )
    if plan.kernel_args.is_empty():
        lines.append("Kernel arguments: nothing to change")
    else:
        lines.append("Kernel arguments:")
        lines.extend(f"  {line}" for line in describe(plan.kernel_args))
    if plan.empty:
        lines.append("")
        lines.append("Nothing to do: the host already matches the plan.")
    for a in plan.actions:
        lines.append("")
        if isinstance(a, WriteFile | RemoveFile):
            verb = "write" if isinstance(a, WriteFile) else "remove"
            lines.append(f"# {verb} /{a.path} — {a.why}")
            lines.append(file_diff(root, a).rstrip("\n"))
        else:
            lines.append(f"# run: {shlex.join(a.argv)} — {a.why}")
    for note in plan.notes:
        lines.append("")
        lines.append(f"note: {note}")
    lines.append("")
    lines.append("Reboot required after apply." if plan.reboot else "No reboot required.")
    return "\n".join(lines)
