"""A Plan: ordered actions plus whether a reboot is needed. Shown, then applied.

The same Plan feeds ``passthrough plan`` (diffs, commands, JSON), Ansible's check mode
and ``passthrough apply``; re-planning an applied host gives a plan without actions.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from passthrough.host.root import HostRoot
from passthrough.plan.kargs import ArgChange, describe


@dataclass(frozen=True)
class WriteFile:
    path: str  # relative to the root
    content: bytes
    why: str
    mode: int = 0o644


@dataclass(frozen=True)
class RemoveFile:
    path: str
    why: str


@dataclass(frozen=True)
class Run:
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


@dataclass
class Plan:
    root: str
    actions: list[Action]
    reboot: bool
    kernel_args: ArgChange
    cards: list[dict[str, Any]]
    bootloader: str
    initramfs: str
    binding: str  # "ids" or "driver_override"
    target_args: ArgChange = field(default_factory=ArgChange)  # what the next boot must have
    functions: list[str] = field(default_factory=list)  # addresses that go to vfio-pci
    notes: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What the journal keeps of this plan, for verify."""
        return {
            "cards": self.cards,
            "functions": self.functions,
            "kernel_args": {
                "set": list(self.target_args.set.values()),
                "remove": sorted(self.target_args.drop),
            },
            "binding": self.binding,
            "bootloader": self.bootloader,
        }

    @property
    def empty(self) -> bool:
        return not self.actions


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


def plan_json(plan: Plan, root: HostRoot) -> dict[str, Any]:
    actions: list[dict[str, Any]] = []
    for a in plan.actions:
        if isinstance(a, WriteFile):
            actions.append(
                {"kind": "write", "path": "/" + a.path, "why": a.why, "diff": file_diff(root, a)}
            )
        elif isinstance(a, RemoveFile):
            actions.append(
                {"kind": "remove", "path": "/" + a.path, "why": a.why, "diff": file_diff(root, a)}
            )
        else:
            actions.append({"kind": "run", "argv": list(a.argv), "why": a.why})
    return {
        "schema": "passthrough.plan/v1",
        "root": plan.root,
        "changed": not plan.empty,
        "reboot_required": plan.reboot,
        "bootloader": plan.bootloader,
        "initramfs": plan.initramfs,
        "binding": plan.binding,
        "cards": plan.cards,
        "functions": plan.functions,
        "kernel_args": {
            "set": list(plan.kernel_args.set.values()),
            "remove": sorted(plan.kernel_args.drop),
        },
        "actions": actions,
        "notes": plan.notes,
    }


def plan_text(plan: Plan, root: HostRoot) -> str:
    lines: list[str] = []
    cards = ", ".join(f"{c['address']} ({c['name']})" for c in plan.cards) or "none"
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
            lines.append(f"# run: {' '.join(a.argv)} — {a.why}")
    for note in plan.notes:
        lines.append("")
        lines.append(f"note: {note}")
    lines.append("")
    lines.append("Reboot required after apply." if plan.reboot else "No reboot required.")
    return "\n".join(lines)
