# SPDX-License-Identifier: Apache-2.0
"""Line-oriented boot files, edited as their tools read them.

``/etc/kernel/cmdline``: kernel-install and the UKI tools take the argument lines and skip
``#`` comment lines. A BLS loader entry: every ``options`` line counts, all joined. We keep
every line we do not change byte for byte, remove an argument on the line where it is,
and append ours to the last argument line (or a new one when there is none).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from passthrough.kargs import ArgChange, key_of

WORD = re.compile(r"\S+")
ArgLine = Callable[[str], bool]


def cmdline_arg_line(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def options_line(line: str) -> bool:
    return re.match(r"options(\s|$)", line) is not None


def _words(line: str, is_options: bool) -> list[re.Match[str]]:
    found = list(WORD.finditer(line))
    return found[1:] if is_options else found


def arguments(text: str, is_arg: ArgLine, is_options: bool) -> list[str]:
    return [m[0] for line in text.split("\n") if is_arg(line) for m in _words(line, is_options)]


def without_spans(line: str, spans: list[tuple[int, int]]) -> str:
    """``line`` without the words at ``spans``, each with one blank beside it."""
    for start, end in sorted(spans, reverse=True):
        if start > 0 and line[start - 1] in " \t":
            start -= 1
        elif end < len(line) and line[end] in " \t":
            end += 1
        line = line[:start] + line[end:]
    return line


def edit_lines(text: str, change: ArgChange, is_arg: ArgLine, new_prefix: str) -> str:
    """``text`` with ``change`` made: a key set to another value or dropped loses its words
    where they are; what is still missing goes at the end of the last argument line."""
    is_options = bool(new_prefix)
    lines = text.split("\n")
    kept: list[str] = []
    last = -1
    for n, line in enumerate(lines):
        if not is_arg(line):
            continue
        last = n
        spans = []
        for m in _words(line, is_options):
            key = key_of(m[0])
            if key in change.drop or (key in change.set and m[0] != change.set[key]):
                spans.append(m.span())
            else:
                kept.append(m[0])
        lines[n] = without_spans(line, spans)
    missing = [a for a in change.set.values() if a not in kept]
    if missing:
        if last >= 0:
            lines[last] = lines[last].rstrip(" \t") + " " + " ".join(missing)
        else:
            at = len(lines) - 1 if lines[-1] == "" else len(lines)
            lines.insert(at, new_prefix + " ".join(missing))
            if at == len(lines) - 1:
                lines.append("")
    return "\n".join(lines)
