# SPDX-License-Identifier: Apache-2.0
"""``passthrough validate``: the validate package's own command line, as a subcommand."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from passthrough.cli.common import EPILOG, Subparsers, command, common, open_root


def add_parser(sub: Subparsers) -> None:
    from passthrough.vm.validate.main import DESCRIPTION, EXAMPLES, add_arguments

    p = command(
        sub,
        "validate",
        run,
        description=DESCRIPTION,
        epilog=EXAMPLES + "\n" + EPILOG,
    )
    add_arguments(p)
    common(p, root=None)


def run(args: argparse.Namespace, stack: ExitStack) -> int:
    from passthrough.vm.validate.main import run as validate

    return validate(args, lambda path: open_root(path, stack))
