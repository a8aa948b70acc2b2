# SPDX-License-Identifier: Apache-2.0
"""``passthrough man [COMMAND]``: the manual pages, which are built from the parsers (the
same text as --help, examples included), shown without installing them anywhere."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from contextlib import ExitStack

from passthrough.cli.common import COMMANDS, Subparsers, command, examples
from passthrough.errors import EXIT_OK, PassthroughError, quote


def add_parser(sub: Subparsers) -> None:
    p = command(
        sub,
        "man",
        run,
        description="Show the manual page of passthrough, or of one command (passthrough-COMMAND(1)), "
        "through man(1) when it is installed, else print the roff source. The pages are generated "
        "from the same parsers as --help; a wheel also installs them under share/man/man1, "
        "where man finds them for a venv on PATH (man passthrough-scan).",
        epilog=examples(
            "passthrough man",
            "passthrough man scan",
            "passthrough man --roff vm > passthrough-vm.1  # the page's source, for a man path",
        ),
    )
    p.add_argument("page", nargs="?", metavar="COMMAND", help="the command whose page to show")
    p.add_argument(
        "--roff",
        action="store_true",
        help="print the page's roff source instead of showing it (for man -l - or a man path)",
    )


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.cli.manpage import one

    if args.page is not None and args.page not in COMMANDS:
        raise PassthroughError(
            f"man: no command {quote(args.page)}; the commands: {', '.join(COMMANDS)}"
        )
    text = one(args.page)
    viewer = None if args.roff else shutil.which("man")
    if viewer is None:
        sys.stdout.write(text)
        return EXIT_OK
    sys.stdout.flush()
    # man reads the page from stdin (-l -), pages it on a terminal and formats it plain
    # into a pipe; its own exit status is not ours to report (a pager quit early is fine)
    subprocess.run([viewer, "-l", "-"], input=text, text=True, check=False, env=os.environ)
    return EXIT_OK
