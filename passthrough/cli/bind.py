"""``passthrough bind``: idle cards onto vfio-pci now, without a reboot (live host)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from passthrough.cli.common import (
    CHANGES,
    EPILOG,
    Subparsers,
    command,
    common,
    confirm,
    dump,
    open_root,
    progress,
    yes_flag,
)
from passthrough.cli.plan import plan_flags
from passthrough.errors import EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "bind",
        run,
        help="bind idle cards to vfio-pci now, without a reboot (live host)",
        description="Unbind each function of the selected cards, set driver_override=vfio-pci and "
        "re-probe, waiting for the kernel's bind event (pyudev). Refuses cards whose GPU driver is "
        "in use or that carry the host console. Not persistent: `apply` makes it stick across "
        "reboots.",
        epilog=EPILOG,
    )
    common(p, CHANGES)
    plan_flags(p)
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait this long for bind events",
    )
    yes_flag(p)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.analysis.policy import judge_all
    from passthrough.execute.bind import bind_now
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.plan.select import select

    root = HostRoot(open_root(args.root, stack, changing="bind"))
    host = discover(root)
    sel = select(host, judge_all(host), list(args.gpu), args.include_group, args.allow_boot_gpu)
    moving = [str(f.address) for f in sel.functions if f.driver != "vfio-pci"]
    if moving:
        confirm(args, "bind", lambda: "bind moves to vfio-pci now: " + ", ".join(moving))
    bound = bind_now(root, host, sel.functions, args.timeout, progress=progress(args))
    if args.json:
        dump({"bound": bound, "functions": [str(f.address) for f in sel.functions]}, "bind")
    elif bound:
        print(
            f"Bound to vfio-pci: {', '.join(bound)} "
            "(until reboot; `passthrough apply` makes it persistent)"
        )
    else:
        print("Already on vfio-pci: nothing to do.")
    return EXIT_OK
