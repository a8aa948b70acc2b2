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


class _WrongField(ValueError):
    """A field of the wrong type or value, named."""


def _entry(addr: object, e: dict[str, Any]) -> LiveEntry:
    """One function's entry, each field of the type it must have (a driver name where a
    string belongs is compared and joined into paths later)."""
    if not isinstance(addr, str):
        raise _WrongField("a function's address is not a string")
    driver = e["host_driver"]
    if driver is not None and (not isinstance(driver, str) or not driver or "/" in driver):
        raise _WrongField(f"{addr}: 'host_driver' is not a driver name or null")
    if e.get("moving") not in (None, "to-vfio", "to-host"):
        raise _WrongField(f'{addr}: \'moving\' is not "to-vfio", "to-host" or null')
    if e["where"] not in ("vfio", "host"):
        raise _WrongField(f'{addr}: \'where\' is not "vfio" or "host"')
    at = e.get("at", 0.0)
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise _WrongField(f"{addr}: 'at' is not a time")
    return LiveEntry(e["host_driver"], e["where"], e.get("moving"), float(at))


class LiveDrivers:
    """The file's entries by PCI address, read once, saved after every change."""

    def __init__(self, root: HostRoot, entries: dict[str, LiveEntry]) -> None:
        self.root = root
        self.entries = entries

    @classmethod
    def load(cls, root: HostRoot) -> LiveDrivers:
        import errno

        from passthrough.inputs import Unreadable, read_bytes
        from passthrough.journal.journal_json import Twice, loads

        path = own(root, LIVE)
        try:  # non-blocking and regular files only: a FIFO planted here must not hang us
            raw = read_bytes(path, "the live-driver journal", LIVE_LIMIT)
        except Unreadable as exc:
            if exc.errno == errno.ENOENT:
                return cls(root, {})
            raise LiveJournalDamaged(path, str(exc)) from None
        try:
            data = loads(raw)  # the journal's strict reader: no key twice, finite numbers
            entries = {addr: _entry(addr, e) for addr, e in data["functions"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            why = f" ({exc})" if isinstance(exc, _WrongField | Twice) else ""
            raise LiveJournalDamaged(
                path, f"not the live-driver journal this version writes{why}"
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
