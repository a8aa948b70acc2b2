# SPDX-License-Identifier: Apache-2.0
"""``bind --stop-holders``: the systemd units that hold a card open, stopped around the
binding and started again after it where they still have a card to use.

Before each ``systemctl stop`` the unit is written to ``var/lib/passthrough/stopped-units.json``
(atomically, in our own state directory), so a ``bind`` killed in between finds it on its next
run and starts those units again (:func:`recover`). Every systemctl call runs under a
timeout: nothing here waits without one. A holder that runs in no unit (a bare pid) is
refused: processes are never killed. On a root that is not the live host the systemctl
commands are printed (``shlex.join``), not run.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from passthrough.errors import PassthroughError
from passthrough.host.holders import Holder
from passthrough.host.modalias import is_vfio
from passthrough.host.root import HostRoot
from passthrough.journal import files
from passthrough.journal.state import STATE, ensure_dir, own
from passthrough.live.bind import BindFailed, BindRefused
from passthrough.model import Host
from passthrough.records import frozen

STOPPED = f"{STATE}/stopped-units.json"
_LIMIT = 1 << 20


@frozen(slots=True)
class Unit:
    """A unit that holds a card open: the drivers of the cards whose nodes it held, and
    whether one was a DRM node (a display server can go on with another card's)."""

    name: str
    drivers: tuple[str, ...]
    drm: bool
    cards: tuple[str, ...]  # the functions whose nodes it held

    def to_json(self) -> dict[str, object]:
        return {
            "unit": self.name,
            "drivers": list(self.drivers),
            "drm": self.drm,
            "cards": list(self.cards),
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Unit:
        def texts(key: str) -> tuple[str, ...]:
            v = d.get(key)
            return tuple(map(str, v if isinstance(v, list) else []))

        return cls(str(d["unit"]), texts("drivers"), bool(d.get("drm")), texts("cards"))


def units_to_stop(host: Host, held: dict[str, list[Holder]]) -> list[Unit]:
    """The units holding the cards, in a stable order; a holder in no unit is refused."""
    every = [h for hs in held.values() for h in hs]
    contained = sorted({f"{h.comm} (pid {h.pid}) holds {h.node}" for h in every if h.container})
    if contained:
        where = sorted({h.container or "" for h in every if h.container})
        raise BindRefused(
            f"{'; '.join(contained)}: runs inside {', '.join(where)}, and --stop-holders stops "
            "only the host's own system services: stop it inside the container, then bind"
        )
    loose = sorted({f"{h.comm} (pid {h.pid}) holds {h.node}" for h in every if not h.unit})
    if loose:
        raise BindRefused(
            f"{'; '.join(loose)}: not in a system service, and --stop-holders stops only those "
            "(it never kills a process): end it, then bind"
        )
    drivers: dict[str, set[str]] = {}
    drm: dict[str, bool] = {}
    cards: dict[str, set[str]] = {}
    by_address = {str(f.address): f for f in host.functions}
    for addr, holders in held.items():
        f = by_address.get(addr)
        for h in holders:
            if h.unit is None:  # refused above
                continue
            if f is not None and f.driver:
                drivers.setdefault(h.unit, set()).add(f.driver)
            drivers.setdefault(h.unit, set())
            cards.setdefault(h.unit, set()).add(addr)
            drm[h.unit] = drm.get(h.unit, False) or h.node.startswith("/dev/dri/")
    return [
        Unit(u, tuple(sorted(drivers[u])), drm[u], tuple(sorted(cards[u]))) for u in sorted(drivers)
    ]


def reason_left(root: HostRoot, host: Host, unit: Unit, bound: set[str]) -> str | None:
    """Why ``unit`` is worth starting again: a display function that is not in ``bound``
    and not on a vfio driver, on a driver the unit used (or any, for a unit that held a DRM
    node). None: its only reason was a card now on vfio."""
    kept: dict[str, list[str]] = {}
    for f in host.functions:
        if not f.is_display or str(f.address) in bound:
            continue
        driver = root.link_name(f"sys/bus/pci/devices/{f.address}/driver")
        if driver and not is_vfio(driver):
            kept.setdefault(driver, []).append(str(f.address))
    same = sorted(a for d in unit.drivers for a in kept.get(d, []))
    if same:
        return f"{', '.join(same)} is still on {'/'.join(unit.drivers)}"
    if unit.drm and kept:
        others = sorted(a for addrs in kept.values() for a in addrs)
        return f"it held a display node, and {', '.join(others)} is still the host's"
    return None


@dataclass
class Systemctl:
    """``systemctl VERB UNIT`` under a timeout on the live host; printed elsewhere."""

    live: bool
    timeout: float
    show: Callable[[str], None] = print
    ran: list[list[str]] = field(default_factory=list)

    def __call__(self, verb: str, unit: str) -> None:
        argv = ["systemctl", verb, unit]
        self.ran.append(argv)
        if not self.live:
            self.show(shlex.join(argv))
            return
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise BindFailed(
                f"`{shlex.join(argv)}` did not finish within {self.timeout:g}s"
            ) from None
        except OSError as exc:
            raise BindFailed(f"`{shlex.join(argv)}`: {exc.strerror}") from None
        if r.returncode:
            err = (r.stderr.strip().splitlines() or [""])[-1]
            raise BindFailed(f"`{shlex.join(argv)}` failed with exit {r.returncode}: {err}")


def _journal(root: HostRoot, units: list[Unit]) -> None:
    ensure_dir(root, STATE)
    path = own(root, STOPPED)
    if not units:
        files.remove(path)
        return
    body = json.dumps({"stopped": [u.to_json() for u in units]}, indent=1) + "\n"
    files.atomic_write(path, body.encode(), mode=0o600, keep=False)


def journaled(root: HostRoot) -> list[Unit]:
    """The units a ``bind --stop-holders`` stopped and has not started again (none: [])."""
    data = files.read_own(own(root, STOPPED), _LIMIT)
    if data is None:
        return []
    try:
        items = json.loads(data)["stopped"]
        return [Unit.from_json(d) for d in items]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise BindRefused(
            f"/{STOPPED}: not the list of units a `bind --stop-holders` stopped; start them "
            "yourself (systemctl start) and remove the file"
        ) from None


@dataclass
class Outcome:
    bound: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # not started again: why
    failed: list[str] = field(default_factory=list)  # starts that failed: why


def restart(
    root: HostRoot,
    host: Host,
    units: list[Unit],
    systemctl: Systemctl,
    bound: set[str],
    out: Outcome,
    journal: bool = True,
) -> None:
    """Start each unit again where a card is left for it; say why not where none is. A
    start that fails stays in the journal (the next ``bind`` tries again)."""
    unstarted: list[Unit] = []
    for unit in units:
        why = reason_left(root, host, unit, bound)
        if why is None:
            out.left.append(
                f"{unit.name} not started again: its only reason was {', '.join(unit.cards)}, "
                f"now on vfio (`systemctl start {unit.name}` if it is still wanted)"
            )
            continue
        try:
            systemctl("start", unit.name)
        except BindFailed as exc:
            out.failed.append(str(exc))
            unstarted.append(unit)
            continue
        out.started.append(f"{unit.name} ({why})")
    if journal:
        _journal(root, unstarted)


def recover(root: HostRoot, host: Host, systemctl: Systemctl) -> Outcome | None:
    """A ``bind --stop-holders`` killed between its stop and its start left its units in
    the journal: start them again now (where a card is left for them)."""
    units = journaled(root)
    if not units:
        return None
    out = Outcome()
    restart(root, host, units, systemctl, set(), out)
    return out


def stop_bind_start(
    root: HostRoot,
    host: Host,
    units: list[Unit],
    systemctl: Systemctl,
    bind: Callable[[], list[str]],
    addresses: list[str],
) -> Outcome:
    """Stop ``units`` (each journaled before its stop), ``bind``, then start them again.
    Whatever fails, the units stopped so far are started again before the error is raised.
    Not on the live host: the commands are printed and ``bind`` is not called."""
    out = Outcome()
    journal = systemctl.live
    stopping: list[Unit] = []

    def bound() -> set[str]:
        # live: the drivers tell what is bound; printed: the cards are taken as bound
        return set(out.bound) if systemctl.live else set(addresses)

    try:
        for unit in units:
            stopping.append(unit)
            if journal:
                _journal(root, stopping)
            systemctl("stop", unit.name)
            out.stopped.append(unit.name)
        if systemctl.live:
            out.bound = bind()
    except PassthroughError as exc:
        restart(root, host, stopping, systemctl, bound(), out, journal)
        started = f"; started again: {', '.join(out.started)}" if out.started else ""
        failed = f"; {'; '.join(out.failed)}" if out.failed else ""
        exc.message += started + failed
        raise
    except BaseException:
        restart(root, host, stopping, systemctl, bound(), out, journal)
        raise
    restart(root, host, stopping, systemctl, bound(), out, journal)
    return out
