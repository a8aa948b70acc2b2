# SPDX-License-Identifier: Apache-2.0
"""What the guest checks report: each check's id, level and fix, the GPUs they looked at, and
the text for people. Standard library only (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .virt import VirtualMachine

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
LEVELS = (PASS, WARN, FAIL, SKIP)

MEM_64 = 0x00100000  # IORESOURCE_MEM_64: the BAR takes this line and the next
CLASS_DISPLAY = 0x03


@dataclass(frozen=True, slots=True)
class GuestCheck:
    id: str
    level: str
    summary: str
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "level": self.level,
            "summary": self.summary,
            "fix": self.fix,
            "data": self.data,
        }


@dataclass(frozen=True, slots=True)
class GuestBar:
    index: int
    start: int
    size: int
    flags: int

    @property
    def is_io(self) -> bool:
        return bool(self.flags & 0x100)  # IORESOURCE_IO

    @property
    def is_mem(self) -> bool:
        return bool(self.flags & 0x200)  # IORESOURCE_MEM

    @property
    def is_64bit(self) -> bool:
        return bool(self.flags & MEM_64)

    @property
    def unset(self) -> bool:
        return bool(self.flags & 0x20000000)  # IORESOURCE_UNSET: the kernel could not place it


@dataclass(frozen=True, slots=True)
class GuestGpu:
    address: str
    vendor_id: int
    device_id: int
    subsystem: str | None
    class_code: int
    driver: str | None
    bars: tuple[GuestBar, ...]
    resource_readable: bool
    # lines of ``resource`` among the six BARs' that are not the kernel's "start end flags"
    resource_bad: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.vendor_id:04x}:{self.device_id:04x}"

    @property
    def is_display(self) -> bool:
        return self.class_code >> 16 == CLASS_DISPLAY


@dataclass(frozen=True, slots=True)
class GuestReport:
    root: str
    live: bool
    machine: VirtualMachine
    gpus: tuple[GuestGpu, ...]
    checks: tuple[GuestCheck, ...]

    @property
    def failed(self) -> bool:
        return any(c.level == FAIL for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "passthrough.guest-check/v1",
            "root": self.root,
            "live": self.live,
            "ok": not self.failed,
            "virtual_machine": {
                "guest": self.machine.guest,
                "hypervisor": self.machine.hypervisor,
                "evidence": list(self.machine.evidence),
            },
            "gpus": [
                {
                    "address": g.address,
                    "id": g.id,
                    "subsystem_id": g.subsystem,
                    "class": f"0x{g.class_code:06x}",
                    "driver": g.driver,
                    "bars": [{"index": b.index, "start": b.start, "size": b.size} for b in g.bars],
                }
                for g in self.gpus
            ],
            "checks": [c.to_json() for c in self.checks],
        }


def shown(text: str) -> str:
    """A text that came from the root (file names, file contents) as one printable line:
    control characters escaped, so a planted name cannot forge a line or a colour."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def render(report: GuestReport, paint: Callable[[str, str], str] = lambda t, _s: t) -> str:
    """Text for people; ``paint(text, level)`` colours the level column."""
    m = report.machine
    lines = [
        (
            f"virtual machine ({m.hypervisor or 'hypervisor not named'}): "
            + shown("; ".join(m.evidence))
            if m.guest
            else "no sign of a virtual machine: this looks like bare metal"
        ),
        "",
    ]
    width = max(len(c.id) for c in report.checks)
    for c in report.checks:
        lines.append(f"{paint(f'{c.level:4}', c.level)}  {c.id:<{width}}  {shown(c.summary)}")
        if c.fix and c.level in (FAIL, WARN):
            lines.append(f"      {'':<{width}}  fix: {shown(c.fix)}")
    counts = {lvl: sum(c.level == lvl for c in report.checks) for lvl in LEVELS}
    lines += [
        "",
        f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed, "
        f"{counts[SKIP]} not applicable or not run",
    ]
    return "\n".join(lines)
