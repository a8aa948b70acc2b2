# SPDX-License-Identifier: Apache-2.0
"""``passthrough release``: cards back from vfio to their host drivers now (live host)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from passthrough.cli.common import (
    CHANGES,
    Subparsers,
    command,
    common,
    confirm,
    dump,
    examples,
    open_root,
    progress,
    yes_flag,
)
from passthrough.errors import EXIT_OK
from passthrough.pciaddr import CARD_METAVAR


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "release",
        run,
        description="The live opposite of bind: each function of the selected cards that is on "
        "a vfio driver is unbound, its driver_override cleared, and handed to the driver it had "
        "before bind (from the live-driver journal) or, where none is known, to the kernel's "
        "default (drivers_probe), one function at a time, each confirmed by the kernel's bind "
        "event. Refuses a card that a guest or a process holds open, naming it. `bind` undoes it.",
        epilog=examples(
            "passthrough release --gpu 01:00.0",
            "passthrough release --gpu 01:00.0 --json --yes",
        ),
    )
    common(p, CHANGES)
    p.add_argument(
        "--gpu",
        dest="gpus",
        action="append",
        default=[],
        metavar=CARD_METAVAR,
        help="a card (repeatable); default: every NVIDIA card with a function on vfio",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait this long for each bind event (default: 10)",
    )
    yes_flag(p)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.journal.state import locked
    from passthrough.live.bind import on_vfio
    from passthrough.live.livedrivers import LiveDrivers
    from passthrough.live.release import release_functions, release_now, release_plan

    root = HostRoot(open_root(args.root, stack, changing="release"))
    host = discover(root)
    functions = release_functions(host, args.gpus)
    journal = LiveDrivers.load(root)
    plan = release_plan(journal, functions)
    if plan:
        confirm(
            args,
            "release",
            lambda: (
                "release gives back to the host now: "
                + ", ".join(f"{a} ({d or 'its default driver'})" for a, d in plan.items())
            ),
        )
    taken: dict[str, str] = {}
    if plan and not root.is_live:
        release_now(root, host, functions, journal, args.timeout)  # refuses, naming why
    elif plan:
        with locked(root):
            taken = release_now(
                root, host, functions, LiveDrivers.load(root), args.timeout, progress=progress(args)
            )
    if args.json:
        dump(
            {
                "root": root.path,
                "released": taken,
                "functions": [str(f.address) for f in functions],
                "planned": plan,
                "left_on_vfio": [
                    str(f.address)
                    for f in functions
                    if on_vfio(f.driver) and str(f.address) not in taken
                ],
            },
            "release",
        )
    elif taken:
        print(
            "Released: "
            + ", ".join(f"{a} ({d})" for a, d in taken.items())
            + " (until reboot; `passthrough bind` takes them back)"
        )
    else:
        print("No function of these cards is on a vfio driver: nothing to do.")
    return EXIT_OK
