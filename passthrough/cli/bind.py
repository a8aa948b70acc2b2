"""``passthrough bind``: idle cards onto vfio-pci now, without a reboot (live host)."""

from __future__ import annotations

import argparse

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
        description="Unbind each function of the selected cards, set driver_override to its vfio "
        "driver (vfio-pci, or the variant driver the running kernel's modules.alias gives it) and "
        "re-probe, waiting for the kernel's bind event (pyudev). Refuses cards whose GPU driver is "
        "in use, that carry the host console, or that a process holds open. Not persistent: "
        "`apply` makes it stick across reboots.",
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


def _named(addresses: list[str], drivers: dict[str, str]) -> str:
    return ", ".join(f"{a} ({drivers.get(a, 'vfio-pci')})" for a in addresses)


def run(args: argparse.Namespace, stack: list[str]) -> int:
    from passthrough.analysis.policy import judge_all
    from passthrough.execute.bind import bind_now
    from passthrough.host.discover import discover
    from passthrough.host.modalias import vfio_drivers
    from passthrough.host.root import HostRoot
    from passthrough.plan.select import select

    root_path = open_root(args.root, stack, changing="bind")
    root = HostRoot(root_path)
    host = discover(root_path)
    sel = select(host, judge_all(host), list(args.gpu), args.include_group, args.allow_boot_gpu)
    drivers = vfio_drivers(root, host.kernel.release, sel.functions)
    moving = [str(f.address) for f in sel.functions if f.driver != drivers[str(f.address)]]
    if moving:
        confirm(args, "bind", lambda: "bind moves to vfio now: " + _named(moving, drivers))
    bound = bind_now(
        root, host, sel.functions, args.timeout, progress=progress(args), drivers=drivers
    )
    if args.json:
        dump(
            {
                "bound": bound,
                "functions": [str(f.address) for f in sel.functions],
                "vfio_drivers": drivers,
            },
            "bind",
        )
    elif bound:
        print(
            f"Bound: {_named(bound, drivers)} "
            "(until reboot; `passthrough apply` makes it persistent)"
        )
    else:
        print("Already on their vfio drivers: nothing to do.")
    return EXIT_OK
