# SPDX-License-Identifier: Apache-2.0
"""The journal of live driver moves: ``bind`` and ``release`` change a function's driver
now, until reboot, and say so here before each write to sysfs.

``ROOT/var/lib/passthrough/live-drivers.json`` holds, per function, the host driver it had
before ``bind`` took it (what ``release`` gives it back to), where it is (``vfio`` or
``host``) and, while a move is under way, ``moving`` — a move cut short by a kill is named
by the next ``status`` of the file, never guessed. Written atomically and durably (the
project's ``atomic_write``) under the state lock, before the step it announces.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from passthrough.errors import PassthroughError
from passthrough.host.root import HostRoot
from passthrough.journal.files import atomic_write, fsync_dir
from passthrough.journal.state import STATE, ensure_dir, own

LIVE = f"{STATE}/live-drivers.json"
LIVE_LIMIT = 4 << 20  # one entry per PCI function: far below this
FORMAT = 1


class LiveJournalDamaged(PassthroughError):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}; move it aside to start afresh (nothing was changed)")


@dataclass
class LiveEntry:
    host_driver: str | None  # the driver before bind took it; None: it had none
    where: str  # "vfio" or "host"
    moving: str | None = None  # "to-vfio" / "to-host" while a move is under way
    at: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "host_driver": self.host_driver,
            "where": self.where,
            "moving": self.moving,
            "at": self.at,
        }


class LiveDrivers:
    """The file's entries by PCI address, read once, saved after every change."""

    def __init__(self, root: HostRoot, entries: dict[str, LiveEntry]) -> None:
        self.root = root
        self.entries = entries

    @classmethod
    def load(cls, root: HostRoot) -> LiveDrivers:
        path = own(root, LIVE)
        try:
            with open(path, "rb") as fh:
                raw = fh.read(LIVE_LIMIT + 1)
        except FileNotFoundError:
            return cls(root, {})
        if len(raw) > LIVE_LIMIT:
            raise LiveJournalDamaged(path, f"larger than {LIVE_LIMIT >> 20} MiB")
        try:
            data = json.loads(raw)
            entries = {
                addr: LiveEntry(
                    host_driver=e["host_driver"],
                    where=e["where"],
                    moving=e.get("moving"),
                    at=float(e.get("at", 0.0)),
                )
                for addr, e in data["functions"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            raise LiveJournalDamaged(
                path, "not the live-driver journal this version writes"
            ) from None
        return cls(root, entries)

    def save(self) -> None:
        ensure_dir(self.root, STATE)
        path = own(self.root, LIVE)
        body = {
            "format": FORMAT,
            "functions": {a: e.as_json() for a, e in sorted(self.entries.items())},
        }
        atomic_write(path, (json.dumps(body, indent=2) + "\n").encode(), mode=0o600, keep=False)
        fsync_dir(os.path.dirname(path))

    def begin(self, addr: str, moving: str, host_driver: str | None) -> None:
        """Before a function's first write: where it goes, and the host driver to remember
        (kept from an earlier bind when the function is on no host driver now)."""
        old = self.entries.get(addr)
        keep = host_driver if host_driver is not None else (old.host_driver if old else None)
        where = old.where if old else ("vfio" if moving == "to-host" else "host")
        self.entries[addr] = LiveEntry(keep, where, moving, time.time())
        self.save()

    def done(self, addr: str, where: str) -> None:
        entry = self.entries[addr]
        self.entries[addr] = LiveEntry(entry.host_driver, where, None, time.time())
        self.save()

    def host_driver(self, addr: str) -> str | None:
        entry = self.entries.get(addr)
        return entry.host_driver if entry else None
