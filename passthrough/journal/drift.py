# SPDX-License-Identifier: Apache-2.0
"""Taking our own lines back out of a file someone changed after apply.

Pure functions on text. Apply only ever adds lines to a file it edits (a marker and module
names in /etc/initramfs-tools/modules), or writes whole files of its own (the GRUB drop-in,
modprobe.d, udev rules). When such a file has changed since, our lines can still be told
apart as long as each is there exactly as often as apply left it; a kernel-argument line
someone extended can still lose exactly the arguments we added (our GRUB appending line,
however an admin rewrote it, is takeback's: it reads that line itself). Anything else is
ambiguous: the caller refuses and offers ``--force``.
"""

from __future__ import annotations

import re
from collections import Counter

from passthrough.boot.shellvalue import render_value, value_words
from passthrough.kargs import key_of
from passthrough.records import frozen

# Files whose whole content is one kernel command line.
CMDLINE_FILES = frozenset({"etc/kernel/cmdline"})
_GRUB_VARS = re.compile(r"GRUB_CMDLINE_LINUX(?:_DEFAULT)?")


@frozen
class Unpicked:
    """The file with our lines taken out (``None``: nothing but ours was left, remove it)."""

    content: bytes | None


@frozen
class Ambiguous:
    why: str


def _strip_args(
    line: str, path: str, added: set[str], dropped: set[str]
) -> tuple[str | None, str | None]:
    """(the line without our arguments, the variable or file it sets) or (None, None). A
    GRUB variable's value is read as the shell reads it and written back so that it
    sources to the same words minus ours (shellvalue.value_words, render_value)."""
    if path in CMDLINE_FILES:
        words, var = line.split(), path
        value = None
    else:
        value = value_words(line)
        if value is None or not _GRUB_VARS.fullmatch(value.name):
            return None, None
        words, var = list(value.words), value.name
    if not added & set(words) and not dropped:
        return None, None
    kept = [w for w in words if w not in added]
    if value is None:
        return " ".join(kept), var
    return value.head + render_value(kept, value.quote) + value.tail, var


def unpick(
    path: str,
    original: bytes,
    written: bytes,
    current: bytes,
    args_set: list[str],
    args_dropped: list[str],
) -> Unpicked | Ambiguous:
    """``current`` without what apply added to ``original`` to make ``written``."""
    try:
        orig_l = original.decode().splitlines()
        wrote_l = written.decode().splitlines()
        cur_l = current.decode().splitlines()
    except UnicodeDecodeError:
        return Ambiguous("not text")
    if Counter(orig_l) - Counter(wrote_l):
        return Ambiguous("apply replaced lines that were there before")
    ours = Counter(wrote_l) - Counter(orig_l)
    have = Counter(cur_l)
    wrote = Counter(wrote_l)
    # lines that are neither the original's nor ours: someone else's, or one of ours edited
    foreign = have - wrote
    added = set(args_set)
    dropped = {key_of(a) for a in args_dropped}
    out = list(cur_l)
    for line, count in ours.items():
        if have[line] == wrote[line]:
            for _ in range(count):  # the last copies are ours: we appended
                idx = len(out) - 1 - out[::-1].index(line)
                del out[idx]
            continue
        if have[line] > wrote[line]:
            return Ambiguous(f"{line!r} is there more often than apply left it")
        if not foreign:  # some copies deleted, nothing new: whatever is left of it is ours
            if orig_l.count(line):
                return Ambiguous(f"{line!r} was deleted and was also there before")
            out = [x for x in out if x != line]
            continue
        # our line was edited: only a kernel-argument line can still be unpicked
        stripped_ours, var = _strip_args(line, path, added, dropped)
        if var is None or stripped_ours is None:
            return Ambiguous(f"our line {line!r} was changed")
        if dropped:
            return Ambiguous(f"{var} was changed and apply had removed arguments from it")
        candidates = [
            i
            for i, cur in enumerate(out)
            if cur not in wrote_l and _strip_args(cur, path, added, set())[1] == var
        ]
        if len(candidates) != 1:
            return Ambiguous(f"{var} is set on {len(candidates)} changed lines")
        new, _var = _strip_args(out[candidates[0]], path, added, set())
        assert new is not None
        out[candidates[0]] = new
    if not original and not any(line.strip() for line in out):
        return Unpicked(None)
    text = "\n".join(out)
    if out and (current.endswith(b"\n") or not current):
        text += "\n"
    return Unpicked(text.encode())
