"""Small text files a user names on the command line (a VM spec, an SSH key file):
read whole but bounded, as UTF-8, with the reason in words when that fails."""

from __future__ import annotations

MAX_INPUT = 1 << 20


class Unreadable(Exception):
    """Why the file cannot be used; the caller names the flag in its own error."""


def read_text(path: str, what: str, limit: int = MAX_INPUT) -> str:
    """The file's text; ``what`` ("a VM spec file") completes the too-large message."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)  # one byte more tells "too large" from "just fits"
    except OSError as exc:
        raise Unreadable(exc.strerror or "cannot read it") from None
    if len(data) > limit:
        raise Unreadable(f"larger than {limit >> 20} MiB: not {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise Unreadable(f"line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 text") from None
