# SPDX-License-Identifier: Apache-2.0
"""Manual pages from the parsers themselves: ``passthrough.1`` and one ``passthrough-CMD.1``
per command, so ``man`` says exactly what ``--help`` says (docs/man/ holds them, kept equal to
the parsers by tests/test_cli.py; ``python -m passthrough.cli.manpage DIR`` writes them).

Only what argparse knows goes in: the description, every option with its help, the
subcommands, the epilog (examples, exit codes). roff is written by hand (a few macros of
man(7)); every text goes through :func:`roff` so a dash, a backslash or a leading dot in a help
string cannot turn into a macro."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from passthrough import __version__

DATE = "2026-11-23"  # bumped with the version: the pages' footer, not the build time
SECTION = "1"


def roff(text: str) -> str:
    """Text made safe for roff: backslashes and dashes escaped, no line starts a macro."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    # groff reads its input as Latin-1 unless preconv runs: name each other character
    text = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)
    return "\n".join(
        ("\\&" + line) if line[:1] in (".", "'") else line for line in text.split("\n")
    )


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                metavar = " " + str(action.metavar or action.dest.upper())
            names = ", ".join(f"\\fB{roff(o)}\\fR" for o in action.option_strings)
            head = names + (f"\\fI{roff(metavar)}\\fR" if metavar else "")
        else:
            head = f"\\fI{roff(str(action.metavar or action.dest))}\\fR"
        out += [".TP", head]
        helptext = action.help or ""
        if action.choices and not isinstance(action.choices, dict):
            helptext += f" (one of: {', '.join(map(str, action.choices))})"
        if "%(default)" in helptext:
            helptext = helptext % {"default": action.default}
        out.append(roff(helptext))
    return out


def _synopsis(parser: argparse.ArgumentParser) -> str:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    return roff(" ".join(usage.split()))


def _body(parser: argparse.ArgumentParser, heading: str = "OPTIONS") -> list[str]:
    out = [f".SH {heading}", *_options(parser)]
    for name, sub in _subparsers(parser).items():
        out += [f".SS {roff(name)}", ".nf", _synopsis(sub), ".fi"]
        if sub.description:
            out += [".PP", roff(sub.description)]
        out += _options(sub)
        # an action's examples (its exit codes are the command's own, shown once under NOTES)
        if sub.epilog and sub.epilog.startswith("examples:"):
            out += [".PP", ".nf", roff(sub.epilog.split("\n\n", 1)[0]), ".fi"]
    return out


def page(prog: str, parser: argparse.ArgumentParser, summary: str) -> str:
    """One manual page."""
    title = prog.upper()
    lines = [
        f'.TH {roff(title)} {SECTION} "{DATE}" "passthrough {__version__}" "passthrough manual"',
        ".SH NAME",
        f"{roff(prog)} \\- {roff(summary)}",
        ".SH SYNOPSIS",
        _synopsis(parser),
    ]
    if parser.description:
        lines += [".SH DESCRIPTION", roff(parser.description)]
    lines += _body(parser)
    if parser.epilog:
        lines += [".SH NOTES", ".nf", roff(parser.epilog.rstrip()), ".fi"]
    if prog != "passthrough":
        lines += [".SH SEE ALSO", "\\fBpassthrough\\fR(1)"]
    return "\n".join(lines) + "\n"


SUMMARY = "GPU passthrough for KVM hosts"


def pages() -> dict[str, str]:
    """File name → page, for passthrough and each of its commands."""
    from passthrough.cli import build_parser

    top = build_parser()
    out = {"passthrough.1": page("passthrough", top, SUMMARY)}
    for name, sub in _subparsers(top).items():
        out[f"passthrough-{name}.1"] = command_page(name, sub)
    return out


def command_page(name: str, parser: argparse.ArgumentParser) -> str:
    """One command's page, its summary the line ``passthrough --help`` gives it."""
    from passthrough.cli.common import COMMANDS

    return page(f"passthrough-{name}", parser, COMMANDS[name])


def one(name: str | None) -> str:
    """The page of one command (None: of passthrough itself), building only its parser."""
    from passthrough.cli import build_parser

    if name is None:
        return page("passthrough", build_parser(), SUMMARY)
    return command_page(name, _subparsers(build_parser(name))[name])


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":  # python -m passthrough.cli.manpage DIR
    for p in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/man")):
        print(p)
