"""Command line: one module per command, each with its parser block and its ``run``; here
the top-level parser, and the one place errors become exit codes and one-line messages.

Exit codes: the table in common.EPILOG (and README "Exit codes"), constants in errors.py.
A command module imports the standard library at the top and the rest inside ``run``, so
that start-up stays lean and ``python3 -m passthrough guest check`` needs no third-party
module.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from passthrough import __version__
from passthrough.cli import (
    bind,
    check,
    completion,
    guest,
    plan,
    provision,
    render,
    sample,
    scan,
    snapshot,
    status,
    undo,
    validate,
    verify,
    vm,
)
from passthrough.cli.common import EPILOG, Parser, Subparsers
from passthrough.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    PassthroughError,
    echo,
)

# in the order --help lists them
COMMANDS = (
    *(scan, check, snapshot, sample, plan, undo, status, verify, bind, render, validate, vm),
    *(provision, guest, completion),
)


class _Unused:
    """Stands in for the parser of a command that was not asked for: whatever its
    ``add_parser`` does to it (flags, groups, subcommands) goes nowhere."""

    def __getattr__(self, _name: str) -> Callable[..., _Unused]:
        return lambda *_a, **_k: self


class _OnlyAsked:
    """Subparsers that build the command asked for in full and only list the others
    (name and help, as --help and a wrong name's error show them): a command's start-up
    need not pay for fifteen parsers."""

    def __init__(self, sub: Subparsers, asked: str) -> None:
        self.sub, self.asked = sub, asked

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if name == self.asked:
            return self.sub.add_parser(name, **kwargs)
        self.sub.add_parser(name, **{k: v for k, v in kwargs.items() if k == "help"})
        return cast(argparse.ArgumentParser, _Unused())


def build_parser(asked: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``asked`` (a command's name) only that command's in full."""
    parser = Parser(
        prog="passthrough",
        description="GPU passthrough for KVM hosts: discover a host honestly, then prepare it.",
    )
    parser.add_argument("--version", action="version", version=f"passthrough {__version__}")
    sub: Subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    if asked is not None:
        sub = _OnlyAsked(sub, asked)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # the first word that is no option names the command (the top level takes no values)
    parser = build_parser(next((w for w in words if not w.startswith("-")), None))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    stack: list[str] = []  # temporary directories (unpacked snapshots, samples) to remove
    try:
        code: int = args.run(args, stack)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except PassthroughError as exc:
        if getattr(args, "debug", False):
            raise
        sys.stderr.write(f"passthrough: error: {exc}\n")
        return exc.exit_code
    except BrokenPipeError:
        # The reader stopped reading (`| head`): not an error. Point stdout at devnull so
        # the interpreter's final flush cannot fail again (the Python docs' advice).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        if getattr(args, "debug", False):
            raise
        where = f"{echo(exc.filename)}: " if exc.filename else ""
        sys.stderr.write(f"passthrough: error: {where}{exc.strerror or exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write(f"passthrough: error: {Interrupted()}\n")
        return EXIT_INTERRUPTED
    finally:
        if stack:  # shutil only where there is something to remove
            import shutil

            for tmp in stack:
                shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["EPILOG", "build_parser", "main"]
