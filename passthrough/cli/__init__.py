# SPDX-License-Identifier: Apache-2.0
"""Command line: one module per command (``passthrough/cli/<name>.py``, the names in
COMMANDS), each with its parser block and its ``run``; here the top-level parser, and the
one place errors become exit codes and one-line messages.

Exit codes: the table in common.EPILOG (and README "Exit codes"), constants in errors.py.
A command module imports the standard library at the top and the rest inside ``run``, so
that start-up stays lean and ``python3 -m passthrough guest check`` needs no third-party
module.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from passthrough import __version__
from passthrough.cli.common import COMMANDS, EPILOG, Parser, Subparsers, examples, verbosity
from passthrough.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    PassthroughError,
    echo_path,
    quote,
)
from passthrough.inert import wrap


def command_module(name: str) -> ModuleType:
    """The module of one command (imported only when that command is asked for)."""
    return importlib.import_module(f"passthrough.cli.{name}")


def unknown_command(word: str) -> str:
    """One line for a word that names no command: the closest name, then all of them."""
    import difflib

    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown command {quote(word)}{hint}; the commands: {', '.join(COMMANDS)}"


def build_parser(asked: str | None = None, listing: bool = False) -> argparse.ArgumentParser:
    """The whole parser; with ``asked`` (a command's name) only that command's in full;
    with ``listing`` (and no command asked) only the list of commands, from the table.

    A command named: only its module is imported and only its parser built (start-up pays
    for neither seventeen parsers nor their imports). ``listing`` is what ``--help``,
    ``--version`` and a wrong first word need: the names and their lines, no command's
    module at all. The man pages and the completion script take everything."""
    parser = Parser(
        prog="passthrough",
        description="GPU passthrough for KVM hosts: discover a host honestly, then prepare it.",
        epilog=examples(
            "passthrough sample build hgx-h100 /tmp/hgx  # a sample host to try it on",
            "passthrough scan --root /tmp/hgx",
            "passthrough plan --root /tmp/hgx --gpu 18:00.0",
            "passthrough man scan  # the manual page of a command",
        ),
    )
    parser.add_argument("--version", action="version", version=f"passthrough {__version__}")
    sub: Subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    if asked is not None and asked in COMMANDS:
        command_module(asked).add_parser(sub)
    elif listing:
        for name, line in COMMANDS.items():
            sub.add_parser(name, help=line)
    else:
        for name in COMMANDS:
            command_module(name).add_parser(sub)
    described(parser)
    return parser


def described(parser: argparse.ArgumentParser) -> None:
    """Every command's and action's --help opens with a description: its one-line help
    from the listing above it, where the command gives no longer one."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if not isinstance(action, argparse._SubParsersAction):
            continue
        lines = {a.dest: a.help for a in action._choices_actions}
        for name, sub in action.choices.items():
            line = lines.get(name)
            if sub.description is None and line:
                sub.description = line[0].upper() + line[1:] + "."
            described(sub)


def tolerant_output() -> None:
    """A terminal or pipe whose encoding cannot hold a character (PYTHONIOENCODING=ascii,
    LANG=C on an old system) gets an escape for it instead of a traceback halfway through
    the output."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            # a stream already closed, or not a text wrapper: left as it is
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    tolerant_output()
    # every line printed passes through one inert stream (passthrough/inert.py):
    # control characters escaped, a closed reader never failing a step
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = wrap(sys.stdout), wrap(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # a command as the first word (before it, only --help or --version could stand, and
    # they want the whole listing)
    if words and not words[0].startswith("-") and words[0] not in COMMANDS:
        sys.stderr.write(f"passthrough: error: {unknown_command(words[0])}\n")
        return EXIT_USAGE
    if words[:1] == ["validate"] and words[1:] and not any(w.startswith("-") for w in words):
        args = command_module("validate").files_only(words[1:])  # no parser to build
    else:
        parser = build_parser(words[0] if words else None, listing=True)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()  # the listing on stdout, the reason on stderr (exit 2)
            sys.stderr.write("passthrough: error: no command given (see the list above)\n")
            return EXIT_USAGE
    verbosity(args)
    # temporary directories (unpacked snapshots, samples): removed whatever happens
    stack = contextlib.ExitStack()
    try:
        with stack:
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
        where = f"{echo_path(exc.filename)}: " if exc.filename else ""
        sys.stderr.write(f"passthrough: error: {where}{exc.strerror or exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write(f"passthrough: error: {Interrupted()}\n")
        return EXIT_INTERRUPTED


__all__ = ["COMMANDS", "EPILOG", "build_parser", "main"]
