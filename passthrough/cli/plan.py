# SPDX-License-Identifier: Apache-2.0
"""``passthrough plan``: the host changes, shown, not made (``apply`` makes them)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import TYPE_CHECKING

from passthrough.cli.common import (
    READS,
    Subparsers,
    command,
    common,
    dump,
    examples,
    open_root,
)
from passthrough.errors import EXIT_OK
from passthrough.plan.options import add_flags, values

if TYPE_CHECKING:
    from passthrough.actions import Plan
    from passthrough.host.root import HostRoot


def plan_flags(p: argparse.ArgumentParser) -> None:
    """Which cards, and how: the options of the host table that bind takes too."""
    add_flags(p, bind=True)


def add_parser(sub: Subparsers) -> None:
    plan = command(
        sub,
        "plan",
        run,
        description="Compute what preparing this host for GPU passthrough changes: kernel "
        "arguments through the bootloader in use, vfio-pci binding (modprobe.d softdeps, "
        "initramfs, per-device overrides). Writes nothing.",
        epilog=examples(
            "passthrough plan",
            "passthrough plan --gpu 0000:01:00.0 --json",
            "passthrough plan --root /mnt/image --gpu 10de:2684",
        ),
    )
    plan_arguments(plan)


def plan_arguments(p: argparse.ArgumentParser, root: str = READS) -> None:
    """The flags plan and apply share: the root, and every option of the host table."""
    common(p, root)
    add_flags(p)


def planned(
    args: argparse.Namespace, stack: ExitStack, changing: str | None = None
) -> tuple[HostRoot, Plan]:
    from passthrough.host.discover import discover
    from passthrough.host.root import HostRoot
    from passthrough.journal.selection import plan_options
    from passthrough.plan.build import make_plan

    root = HostRoot(open_root(args.root, stack, changing))
    opts = plan_options(root, values(args))
    plan, _sel = make_plan(root, discover(root), opts)
    return root, plan


def owed(root: HostRoot) -> list[list[str]]:
    """Commands an earlier apply could only list (or that failed) and that are still owed:
    plan, apply and status name the same ones."""
    from passthrough.journal.status import status

    return [p.argv for p in status(root).pending]


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    import shlex

    from passthrough.actions import plan_text

    root, plan = planned(args, stack)
    pending = owed(root)
    if args.json:
        dump({**plan.to_json(root), "pending": pending}, "plan")
        return EXIT_OK
    print(plan_text(plan, root))
    if pending:
        print("\nStill pending from an earlier apply (run it inside the root, or `apply` again):")
        for argv in pending:
            print("  " + shlex.join(argv))
    return EXIT_OK
