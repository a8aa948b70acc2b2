# SPDX-License-Identifier: Apache-2.0
"""``passthrough apply``: the planned host changes, made (atomic, backed up, journaled)."""

from __future__ import annotations

import argparse
import shlex
from contextlib import ExitStack

from passthrough.cli.common import (
    CHANGES,
    Subparsers,
    command,
    confirm,
    dump,
    examples,
    progress,
    yes_flag,
)
from passthrough.cli.plan import owed, plan_arguments, planned
from passthrough.errors import EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "apply",
        run,
        description="Execute the plan: lock, back up each file, journal each step before it, write "
        "atomically, run the regeneration commands. Stops at the first failure; `undo` restores. "
        "Re-running on an applied host changes nothing. Under --root, commands run through chroot "
        "when DIR is a full OS tree (and you are root), and are listed otherwise.",
        epilog=examples(
            "passthrough apply --gpu 0000:01:00.0",
            "passthrough apply --root /tmp/hgx --gpu 18:00.0 --hugepages-1g 16",
            "passthrough apply --yes  # the live host, from a script: no question asked",
        ),
    )
    plan_arguments(p, CHANGES)
    yes_flag(p)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.execute.apply import apply, apply_json, command_mode, listed
    from passthrough.plan.actions import plan_text

    root, plan = planned(args, stack, changing="apply")
    if not plan.empty:
        confirm(args, "apply", lambda: plan_text(plan, root))
    tx = apply(root, plan, plan.record(), progress=progress(args))
    # commands an earlier apply could only list are still owed, whether or not this run
    # changed anything (this run's own listed commands are named apart)
    now = listed(tx)
    still = [argv for argv in owed(root) if argv not in now]
    if args.json:
        dump({"root": root.path, **apply_json(tx, plan, still)}, "apply")
        return EXIT_OK
    if tx is None:
        print("Nothing to do: the host already matches the plan.")
        for argv in still:
            print("  still pending (run it inside the root): " + shlex.join(argv))
        return EXIT_OK
    print(f"Applied {len(tx.steps)} steps (transaction {tx.id}).")
    if listed(tx):
        print(
            f"Not run ({command_mode(root)} mode: --root is not a full OS tree, or not root): "
            "run them inside it:"
        )
        for argv in now:
            print("  " + shlex.join(argv))
    if still:
        print("Still pending from an earlier apply (run them inside the root too):")
        for argv in still:
            print("  " + shlex.join(argv))
    print("Reboot, then run `passthrough verify`." if plan.reboot else "No reboot required.")
    return EXIT_OK
