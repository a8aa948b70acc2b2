# SPDX-License-Identifier: Apache-2.0
"""What the GRUB shell reader refuses beyond assignments, each with the file and line:

- ``set`` options that change how grub-mkconfig runs the rest of its work: ``-f``
  (``noglob``: its loop over /etc/default/grub.d/*.cfg then reads no file, ours included),
  ``-u`` (``nounset``: a reference to an unset variable, ours among them, stops it) and
  ``-n`` (``noexec``: nothing after the line runs);
- a kernel-line variable whose value spans lines: grub-mkconfig writes it into grub.cfg's
  ``linux`` line as it is, so what follows the line break (our arguments with it) is a line
  that GRUB runs as a command.

Here-documents are refused where the lines are split (shellvalue.logical_lines): their
body is text, and read as commands it can hide or fake an assignment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from passthrough.boot.shellvalue import ShellVars
from passthrough.kargs import UnsafeCmdline

# the single-letter options and their -o names, with what each would do to grub-mkconfig
REFUSED = {
    "f": "turns pathname expansion off (grub-mkconfig's loop over grub.d/*.cfg reads nothing)",
    "u": "makes a reference to an unset variable stop grub-mkconfig",
    "n": "stops the shell running anything after it",
}
LONG = {"noglob": "f", "nounset": "u", "noexec": "n"}


def set_options(words: Sequence[str]) -> list[str]:
    """The refused options a ``set`` command's arguments (after ``set``) turn on."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("--", "-") or not word.startswith("-"):
            break  # positional parameters from here on
        if word == "-o":
            name = words[i + 1] if i + 1 < len(words) else ""
            out += [LONG[name]] if name in LONG else []
            i += 2
            continue
        out += [c for c in word[1:] if c in REFUSED]
        i += 1
    return list(dict.fromkeys(out))


def refuse_set(words: Sequence[str], where: str) -> None:
    """Refuse ``set`` (``words``: the command with its arguments) turning on one of REFUSED."""
    if not words or words[0] != "set":
        return
    if found := set_options(words[1:]):
        why = "; ".join(f"-{c} {REFUSED[c]}" for c in found)
        raise UnsafeCmdline(where, f"runs set {' '.join(words[1:])}: {why}; remove it")


def one_line(state: ShellVars, names: Iterable[str]) -> None:
    """Refuse a value of ``names`` holding a line break, naming where it was written."""
    for name in names:
        for c, origin in state.values.get(name, []):
            if c in "\n\r":
                where = f"{origin.path}:{origin.first}" if origin else name
                raise UnsafeCmdline(
                    where,
                    f"{name}'s value spans lines: grub.cfg would get the rest of the kernel "
                    "line (ours with it) on a line GRUB runs as a command; write it on one line",
                )
