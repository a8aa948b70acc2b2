# SPDX-License-Identifier: Apache-2.0
"""``passthrough bind``: idle cards onto vfio-pci now, without a reboot (live host)."""

from __future__ import annotations

import argparse
import shlex
from contextlib import ExitStack
from typing import TYPE_CHECKING

from passthrough.cli.common import (
    CHANGES,
    Subparsers,
    command,
    common,
    confirm,
    dump,
    examples,
    is_live,
    note,
    open_root,
    progress,
    yes_flag,
)
from passthrough.cli.plan import plan_flags
from passthrough.errors import EXIT_HOST_STEP, EXIT_OK

if TYPE_CHECKING:
    from collections.abc import Callable

    from passthrough.host.root import HostRoot
    from passthrough.live.holders import Outcome
    from passthrough.model import Host, PciFunction


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "bind",
        run,
        description="Unbind each function of the selected cards, set driver_override to its vfio "
        "driver (vfio-pci, or the variant driver the running kernel's modules.alias gives it) and "
        "re-probe, waiting for the kernel's bind event (pyudev). Refuses cards whose GPU driver is "
        "in use, that carry the host console, or that a process holds open. Not persistent: "
        "`apply` makes it stick across reboots.",
        epilog=examples(
            "passthrough bind --gpu 01:00.0",
            "passthrough bind --gpu 10de:2684 --stop-holders --yes",
        ),
    )
    common(p, CHANGES)
    plan_flags(p)
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait this long for bind events (default: 10)",
    )
    p.add_argument(
        "--stop-holders",
        action="store_true",
        help="stop the systemd units that hold the cards open (nvidia-persistenced, a display "
        "manager), bind, then start them again where a card is left for them; a process in no "
        "unit is refused, never killed. On another root (--root DIR) the systemctl commands it would "
        "run for that root's holders are printed; binding itself needs the live host",
    )
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with --stop-holders: wait this long for each systemctl stop or start (default: 30)",
    )
    yes_flag(p)


def _named(addresses: list[str], drivers: dict[str, str]) -> str:
    return ", ".join(f"{a} ({drivers.get(a, 'vfio-pci')})" for a in addresses)


def _report(args: argparse.Namespace, out: Outcome | None, recovered: bool = False) -> None:
    """What became of the units: started again, left stopped (and why), failed starts."""
    if out is None or args.json:
        return
    if recovered:
        note(
            args,
            "a `bind --stop-holders` was cut short: the units it stopped are started again first",
        )
    # printed commands (not the live host) stay a script: the prose is a comment there
    mark = "" if is_live(args.root) else "# "
    for line in out.started:
        print(f"{mark}Started again: {line}")
    for line in out.left + out.failed:
        print(mark + line)


def _binder(
    args: argparse.Namespace,
    root: HostRoot,
    host: Host,
    functions: list[PciFunction],
    drivers: dict[str, str],
) -> Callable[[], list[str]]:
    """The bind itself, run alone or between stopping and starting the holders' units."""
    from passthrough.live.bind import bind_now
    from passthrough.live.livedrivers import LiveDrivers

    def bind() -> list[str]:
        # the host drivers it leaves, noted for `release` (only where it binds: the live host)
        journal = LiveDrivers.load(root) if root.is_live else None
        return bind_now(
            root,
            host,
            functions,
            args.timeout,
            progress=progress(args),
            drivers=drivers,
            journal=journal,
        )

    return bind


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.analysis.policy import judge_all
    from passthrough.host.discover import discover
    from passthrough.host.holders import find_holders
    from passthrough.host.modalias import vfio_drivers
    from passthrough.host.root import HostRoot
    from passthrough.journal.state import locked
    from passthrough.live.holders import (
        STOPPED,
        Systemctl,
        recover,
        stop_bind_start,
        units_to_stop,
    )
    from passthrough.plan.select import select

    root = HostRoot(open_root(args.root, stack, changing="bind"))
    host = discover(root)
    quiet = args.json or getattr(args, "quiet", False)
    systemctl = Systemctl(root.is_live, args.stop_timeout, (lambda _c: None) if quiet else print)
    if root.is_live and root.exists(STOPPED):
        with locked(root):
            _report(args, recover(root, host, systemctl), recovered=True)
    sel = select(host, judge_all(host), list(args.gpus), args.include_group, args.allow_boot_gpu)
    addresses = [str(f.address) for f in sel.functions]
    drivers = vfio_drivers(root, host.kernel.release, sel.functions)
    units = units_to_stop(host, find_holders(root, addresses)) if args.stop_holders else []
    moving = [str(f.address) for f in sel.functions if f.driver != drivers[str(f.address)]]
    if moving:
        stops = f"; stops {', '.join(u.name for u in units)} first" if units else ""
        confirm(args, "bind", lambda: f"bind moves to vfio now: {_named(moving, drivers)}{stops}")

    bind = _binder(args, root, host, sel.functions, drivers)

    out = None
    if units and root.is_live:
        with locked(root):
            out = stop_bind_start(root, host, units, systemctl, bind, addresses)
        bound = out.bound
    elif units:
        out = stop_bind_start(root, host, units, systemctl, bind, addresses)
        note(
            args,
            "not the live host: the systemctl commands are printed, not run; nothing was bound",
        )
        bound = []
    else:
        bound = bind()
    if args.json:
        dump(
            {
                "root": root.path,
                "bound": bound,
                "functions": addresses,
                "vfio_drivers": drivers,
                "systemctl": [shlex.join(c) for c in systemctl.ran],
                "not_started": out.left if out else [],
                "start_failed": out.failed if out else [],
            },
            "bind",
        )
        return EXIT_HOST_STEP if out and out.failed else EXIT_OK
    if bound:
        print(
            f"Bound: {_named(bound, drivers)} "
            "(until reboot; `passthrough apply` makes it persistent)"
        )
    elif root.is_live:
        print("Already on their vfio drivers: nothing to do.")
    _report(args, out)
    # the binding held, but a unit that was running is not: a step on the host failed
    return EXIT_HOST_STEP if out and out.failed else EXIT_OK
