# SPDX-License-Identifier: Apache-2.0
"""``passthrough apply``: the planned host changes, made (atomic, backed up, journaled)."""

from __future__ import annotations

import argparse
import shlex
import sys
from contextlib import ExitStack
from typing import TYPE_CHECKING

from passthrough.cli.common import (
    CHANGES,
    Subparsers,
    command,
    confirm,
    dump,
    examples,
    progress,
    say_listed,
    yes_flag,
)
from passthrough.cli.plan import owed, plan_arguments, planned
from passthrough.errors import EXIT_OK, count

if TYPE_CHECKING:  # the command's modules load when it runs (start-up stays light)
    from passthrough.actions import Plan
    from passthrough.boot.readback import NextBoot
    from passthrough.host.root import HostRoot
    from passthrough.journal.journal import Transaction


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
    p.add_argument(
        "--force",
        action="store_true",
        help="write --hugepages-1g where the root reports no RAM (no /proc/meminfo) to check "
        "the pages against: the machine that boots it must have more",
    )


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.actions import plan_text
    from passthrough.journal import nextboot
    from passthrough.journal.apply import apply, apply_json, listed, why_listed
    from passthrough.plan.options import values
    from passthrough.plan.reserve import refuse_unsized

    root, plan = planned(args, stack, changing="apply")
    forced = refuse_unsized(root, values(args)["hugepages_1g"], args.force)
    if forced:
        print(f"warning: {forced}", file=sys.stderr)
    if not plan.empty:
        confirm(args, "apply", lambda: plan_text(plan, root))
    tx = apply(root, plan, plan.record(), progress=progress(args))
    # commands an earlier apply could only list are still owed, whether or not this run
    # changed anything (this run's own listed commands are named apart)
    now = listed(tx)
    still = [argv for argv in owed(root) if argv not in now]
    checked = next_boot(root, tx, plan, still)
    reboot = nextboot.reboot_due(root, tx, plan)
    if args.json:
        extra = {"next_boot": nextboot.to_json(checked)} if checked else {}
        out = {**apply_json(tx, plan, still), "reboot_required": reboot}
        dump({"root": root.path, **out, **extra}, "apply")
        if checked and checked.missing:
            raise nextboot.NextBootLacks(checked.missing)
        return EXIT_OK
    for warning in plan.warnings:  # what scan warns about these cards, whatever this run did
        print(f"warning: {warning}", file=sys.stderr)
    if tx is None:
        print("Nothing to do: the host already matches the plan.")
        for argv in still:
            print("  still pending (run it inside the root): " + shlex.join(argv))
        if checked is not None:
            said_next_boot(checked)  # what an earlier apply left: a lack is exit 5 again
        if reboot and not still:
            print("The running kernel lacks it yet: reboot, then run `passthrough verify`.")
        return EXIT_OK
    print(f"Applied {count(len(tx.steps), 'step')} (transaction {tx.id}).")
    if still:
        print("Still pending from an earlier apply (run them inside the root too):")
        for argv in still:
            print("  " + shlex.join(argv))
    if checked is not None:
        said_next_boot(checked)
    if now:
        print("What the next boot gets is not checked: the commands below did not run here.")
        say_listed(
            why_listed(root),
            now,
            "Then reboot, and run `passthrough verify`."
            if reboot
            else "No reboot required after them.",
        )
    else:
        print("Reboot, then run `passthrough verify`." if reboot else "No reboot required.")
    return EXIT_OK


def next_boot(
    root: HostRoot, tx: Transaction | None, plan: Plan, still: list[list[str]]
) -> NextBoot | None:
    """What the next boot reads, checked where this apply runs commands (None where they
    are listed instead). With nothing to do it is checked too: an earlier apply that ended
    in exit 5 (the next boot lacks it) must not read as done when run again."""
    from passthrough.journal import nextboot
    from passthrough.journal.apply import command_mode

    if command_mode(root) == "list":
        return None
    if tx is None:
        return nextboot.check_record(root, plan.record(), plan.initramfs, not_run=still)
    return nextboot.check(root, tx, plan.initramfs)


def said_next_boot(checked: NextBoot) -> None:
    """The check's outcome before "reboot"; a lack stops here (exit 5, one line)."""
    from passthrough.journal import nextboot

    if checked.missing:
        raise nextboot.NextBootLacks(checked.missing)
    if checked.not_run:
        print(
            "What the next boot gets is not checked: the regeneration did not run ("
            + "; ".join(shlex.join(a) for a in checked.not_run)
            + ")."
        )
        return
    if checked.checked:
        print("Checked what the next boot reads: " + ", ".join(checked.checked) + ".")
    if checked.unchecked:
        print("Not checked: " + "; ".join(checked.unchecked) + ".")
