# SPDX-License-Identifier: Apache-2.0
"""Output that can neither drive a terminal nor fail a step: the one place every line the
CLI prints (results, progress, notes, errors, ``-v`` logs) passes through.

What we print holds text from files, journals and device strings, and a journal lies in a
root that may be someone else's image: an escape sequence there could clear the admin's
screen and write a fake "No command pending.". Every control character except newline and
tab is written as an escape (``\\x1b``; DEL and the C1 range as ``\\u009b``, which stays
valid inside a JSON string), except the colour sequences :mod:`passthrough.output.text`
paints with (:data:`STYLES`).

A reader that went away (``apply 2>&1 | head -1``) makes a write fail with EPIPE. That
must never turn a step that is done into a failed one, or stop a transaction half-way:
the stream notes it, points its descriptor at /dev/null, and the command carries on.
"""

from __future__ import annotations

import contextlib
import io
import os
import re

TYPE_CHECKING = False

if TYPE_CHECKING:  # start-up imports no typing (tests/test_cli.py)
    from typing import Any, TextIO

# The colours text.py paints with: the only escape sequences let through.
RESET = "\033[0m"
STYLES = {
    "bold": "\033[1m",
    "dim": "\033[2m",
    "red": "\033[31m",
    "green": "\033[32m",
    "yellow": "\033[33m",
    "cyan": "\033[36m",
}
_OURS = "|".join(re.escape(s) for s in (*STYLES.values(), RESET))
# a carriage return just before a newline only ends the line (a pty's, Ansible's output): kept
_CONTROL = re.compile(f"({_OURS}|\r\n)|[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f]")
# The ASCII characters _CONTROL can match (its colours and CR-LF start with one of them):
# ASCII text without any is returned as it is. The substitution tries the alternation at
# every position (about 170 ms over scan --json's 1 MB on 2,000 functions); looking for each
# of these with ``in`` (memchr-fast) takes a few.
_ASCII_CONTROLS = tuple(chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F))


def _escape(m: re.Match[str]) -> str:
    if m.group(1):
        return m.group(1)  # our own colour, or a line's end
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """``text`` with every control character but newline, tab and CR-LF escaped."""
    if text.isascii():
        if not any(c in text for c in _ASCII_CONTROLS):
            return text
    elif _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escape, text)


class InertStream(io.TextIOBase):
    """A text stream whose writes are :func:`inert` and survive a closed reader."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                self.stream.write(inert(text))
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        """The reader closed its end: what is still buffered, and all that follows, goes
        to /dev/null (so the interpreter's last flush cannot fail either)."""
        self.reader_gone = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def wrap(stream: TextIO) -> TextIO:
    """``stream`` made inert (once: a stream already wrapped is returned as it is)."""
    if isinstance(stream, InertStream):
        return stream
    return InertStream(stream)  # type: ignore[return-value]  # a TextIO in all but name
