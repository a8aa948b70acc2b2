# SPDX-License-Identifier: Apache-2.0
"""``passthrough undo``: every file apply changed back to its original, then regenerate."""

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
    say_listed,
    yes_flag,
)
from passthrough.errors import EXIT_OK, count


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "undo",
        run,
        description="Put back the original of every file apply changed (all transactions) when it "
        "still holds what apply wrote; a file changed since loses only our own lines where they "
        "can be told apart, otherwise undo refuses (exit 2, nothing changed) and names it. "
        "Generated files (grub.cfg, initramfs images, BLS entries) are never restored from a "
        "backup: the plan's own tools run again for every kernel installed now (listed and left "
        "pending where commands cannot run). A missing backup: the rest is restored, exit 3.",
        epilog=examples(
            "passthrough undo",
            "passthrough undo --root /tmp/hgx",
            "passthrough undo --root /tmp/hgx --force --json",
        ),
    )
    common(p, CHANGES)
    p.add_argument(
        "--force",
        action="store_true",
        help="put our backups back even over files changed since apply (those changes are lost)",
    )
    yes_flag(p)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.root import HostRoot
    from passthrough.journal.apply import why_listed
    from passthrough.journal.status import status, status_text
    from passthrough.journal.undo import undo

    root = HostRoot(open_root(args.root, stack, changing="undo"))
    st = status(root)
    if any(t.kind == "apply" and t.state != "undone" for t in st.transactions) or st.pending:
        confirm(args, "undo", lambda: status_text(st))
    result = undo(root, progress=progress(args), force=args.force)
    if args.json:
        dump({"root": root.path, **result.to_json()}, "undo")
    elif result.changed or result.commands:
        removed = result.removed
        put_back = len(result.restored) - len(removed)
        parts = [f"Restored {count(put_back, 'file')}"] if put_back or not removed else []
        if removed:
            parts.append(
                f"{'removed' if parts else 'Removed'} {count(len(removed), 'file')} apply created"
            )
        if result.unpicked:
            parts.append(f"took our lines out of {len(result.unpicked)} changed since apply")
        if result.forced:
            parts.append(f"put {len(result.forced)} back over later changes (--force)")
        print("; ".join(parts) + ".")
        back = "reboot to return to the original kernel arguments and drivers."
        if result.listed:
            say_listed(why_listed(root), result.listed, f"Then {back}")
        else:
            print(back.capitalize())
    else:
        print("Nothing to undo.")
    return EXIT_OK
