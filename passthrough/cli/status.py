# SPDX-License-Identifier: Apache-2.0
"""``passthrough status``: what apply and undo did to this host, drift since, pending commands."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from passthrough.cli.common import Subparsers, command, common, dump, examples, open_root
from passthrough.errors import EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "status",
        run,
        description="The transactions in the journal (id, time, state), the files and kernel "
        "arguments each changed, whether each file still holds what apply wrote, and every "
        "command pending because it failed or could only be listed.",
        epilog=examples(
            "passthrough status",
            "passthrough apply --root /tmp/hgx --gpu 18:00.0 && passthrough status --root /tmp/hgx --json",
        ),
    )
    common(p)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.host.root import HostRoot
    from passthrough.journal.status import status, status_json, status_text

    report = status(HostRoot(open_root(args.root, stack)))
    if args.json:
        dump(status_json(report), "status")
    else:
        print(status_text(report))
    return EXIT_OK
