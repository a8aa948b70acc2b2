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


def files_only(files: list[str]) -> argparse.Namespace:
    """``passthrough validate FILE...`` with file names alone (what a pre-commit or CI hook
    passes): the namespace the parser would give, without building the parser, whose
    set-up (the help formatter's terminal size, gettext's locale) is a fifth of a one-file
    run. ``tests/test_cli.py`` holds it equal to the parser's."""
    from passthrough.vm.validate.main import DEFAULTS

    return argparse.Namespace(
        command="validate", run=run, files=files, **DEFAULTS, color="auto", quiet=False, verbose=0
    )
