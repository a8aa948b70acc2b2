# SPDX-License-Identifier: Apache-2.0
"""GRUB (Debian/Ubuntu, upstream GRUB on Arch and others, openSUSE's grub2-mkconfig): our
arguments as a delta on the admin's configuration.

Which files count is the host's own grub-mkconfig's business (host/boot.read_grub reads it):
Debian's sources /etc/default/grub, then every /etc/default/grub.d/*.cfg in sort order, and
our drop-in there *appends* to ``GRUB_CMDLINE_LINUX_DEFAULT`` as the shell has it at that
point; upstream's sources /etc/default/grub only, so the same appending line goes at the end
of that file, after a marker line of ours. Either way whatever the admin sets before it
(today or after apply) still takes effect, followed by ours. An argument that must go (``amd_iommu=on``, ``intel_iommu=off``, another
value of a key we set) is removed where the admin wrote it: that file is edited in place,
journaled like every write, and the plan shows the diff. Files sorting after ours are
sourced after ours: the plan is refused when, with them, our arguments would not be what
the kernel gets.
"""

from __future__ import annotations

import re

from passthrough.errors import PassthroughError
from passthrough.model import BootloaderKind, GrubReading
from passthrough.plan.actions import Action, RemoveFile, Run, WriteFile
from passthrough.plan.bootloader_base import Bootloader
from passthrough.plan.kargs import ArgChange, UnsafeCmdline, edit, key_of, utf8_text
from passthrough.plan.shell_refuse import one_line
from passthrough.plan.shellvalue import Origin, ShellVars
from passthrough.plan.shellvars import append_missing, is_our_line, source

MAIN = "etc/default/grub"
GRUB_D = "etc/default/grub.d"
DROPIN = f"{GRUB_D}/99-passthrough.cfg"
VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
TARGET = "GRUB_CMDLINE_LINUX_DEFAULT"  # for normal boots; comes last on the kernel line
HEADER = (
    "# Written by passthrough (GPU passthrough kernel arguments); 'passthrough undo' removes it.\n"
    "# It appends to the value set before it what is not there yet: edit /etc/default/grub\n"
    "# as usual.\n"
)

# our two lines at the end of /etc/default/grub where grub-mkconfig reads no grub.d
MARKER = (
    "# passthrough: GPU passthrough kernel arguments (next line); 'passthrough undo' removes both"
)

Removal = tuple[Origin, str]  # where an argument was written, and the argument


def dropin_text(args: list[str]) -> str:
    return HEADER + _line(args)


class GrubUnknown(PassthroughError):
    """How this host's grub-mkconfig reads its configuration cannot be told (exit 2)."""

    def __init__(self, why: str, args: list[str] | None = None) -> None:
        what = " ".join(args) if args else "the kernel arguments"
        super().__init__(f"{why}; nothing was written: add {what} by hand")
        self.why = why


def _line(args: list[str]) -> str:
    """Appends each argument not on the kernel line yet: sourced twice (an
    /etc/default/grub that sources grub.d itself), each is there once."""
    return append_missing(TARGET, VARS, args) + "\n"


def _without_block(text: str) -> tuple[str, int | None]:
    """``text`` without our marker and our appending line (the first after the marker),
    and the 1-based number of that line (None: no block of ours). Every other line stays
    where it is, an admin's line written between the two included."""
    lines = text.split("\n")
    if MARKER not in lines:
        return text, None
    at = lines.index(MARKER)
    ours = next((n for n in range(at + 1, len(lines)) if is_our_line(lines[n], TARGET)), None)
    gone = {at} if ours is None else {at, ours}
    kept = "\n".join(line for n, line in enumerate(lines) if n not in gone)
    return kept, None if ours is None else ours + 1


def with_block(text: str, args: list[str]) -> str:
    """``text`` (ours taken out first) with our marker and appending line at its end."""
    base, _ = _without_block(text)
    if not args:
        return base
    if base and not base.endswith("\n"):
        base += "\n"
    return base + MARKER + "\n" + _line(args)


def _remove_word(lines: list[str], origin: Origin, word: str) -> bool:
    """Take ``word`` out of the first line in ``origin``'s span that has it as a word."""
    pattern = re.compile(r"(?<![^\s\"'])" + re.escape(word) + r"(?![^\s\"'])")
    for n in range(origin.first - 1, min(origin.last, len(lines))):
        m = pattern.search(lines[n])
        if m is None:
            continue
        start, end = m.start(), m.end()
        line = lines[n]
        if start > 0 and line[start - 1] in " \t":
            start -= 1
        elif end < len(line) and line[end] in " \t":
            end += 1
        lines[n] = line[:start] + line[end:]
        return True
    return False


class Grub(Bootloader):
    """An appending line where this host's grub-mkconfig reads it (a drop-in in
    /etc/default/grub.d, or the end of /etc/default/grub), then update-grub or
    grub-mkconfig -o grub.cfg."""

    name = BootloaderKind.GRUB
    DROPIN = DROPIN

    @property
    def reading(self) -> GrubReading:
        grub = self.host.boot.grub
        if grub is None or grub.dropins is None:
            raise GrubUnknown(grub.why if grub else "how GRUB reads its configuration is unknown")
        return grub

    @property
    def ours_in(self) -> str:
        """The file our appending line is in, relative to the root."""
        return DROPIN if self.reading.dropins else MAIN

    def _ours_at(self, override: dict[str, str | None]) -> Origin | None:
        """Where our appending line is (None: not written yet)."""
        if self.ours_in == DROPIN:
            return None
        text = override[MAIN] if MAIN in override else self._read("/" + MAIN)
        _, at = _without_block(text or "")
        return None if at is None else Origin("/" + MAIN, at, at)

    def _is_ours(self, origin: Origin | None, at: Origin | None) -> bool:
        if origin is None:
            return False
        return origin.path == "/" + DROPIN if self.ours_in == DROPIN else origin == at

    def _read(self, path: str) -> str | None:
        return utf8_text(self.root.read_bytes(path.lstrip("/")), path)

    def _dropins(self, extra: set[str]) -> list[str]:
        """grub.d/*.cfg (with ``extra`` paths written by the plan) in byte order, as /bin/sh
        expands the pattern."""
        names = {n for n in self.root.listdir(GRUB_D) if n.endswith(".cfg")}
        names |= {p.rsplit("/", 1)[1] for p in extra if p.startswith(GRUB_D + "/")}
        return [f"{GRUB_D}/{n}" for n in sorted(names, key=lambda s: s.encode())]

    def _order(self, extra: set[str]) -> list[str]:
        if not self.reading.dropins:
            return [MAIN]  # upstream grub-mkconfig: grub.d is never read
        return [MAIN, *self._dropins(extra)]

    def evaluate(self, override: dict[str, str | None] | None = None) -> ShellVars:
        """The variables as grub-mkconfig ends with them (``override``: path → text)."""
        override = override or {}

        def read(path: str) -> str | None:
            rel = path.lstrip("/")
            return override[rel] if rel in override else self._read(path)

        def listdir(path: str) -> list[str]:  # grub.d as it will be, for a loop over it
            return [p.rsplit("/", 1)[1] for p in self._dropins(set(override)) if read("/" + p)]

        state = ShellVars(frozenset(VARS), listdir=listdir)
        if self.root.read_bytes(MAIN) is None and MAIN not in override:
            raise UnsafeCmdline("/" + MAIN, "missing, although GRUB was detected")
        for rel in self._order(set(override)):
            text = read("/" + rel)
            if text is not None:
                source(text, "/" + rel, state, read)
        one_line(state, VARS)  # a line break in the kernel line: GRUB runs the rest
        return state

    def configured(self) -> list[str]:
        state = self.evaluate()
        return [w for var in VARS for w, _ in state.words(var)]

    def ours(self, state: ShellVars) -> list[str]:
        at = self._ours_at({})
        return [w for w, o in state.words(TARGET) if self._is_ours(o, at)]

    def _removals(self, state: ShellVars, change: ArgChange) -> list[Removal]:
        out: list[Removal] = []
        at = self._ours_at({})
        for var in VARS:
            for word, origin in state.words(var):
                key = key_of(word)
                if self._is_ours(origin, at):
                    continue
                if key in change.drop or (key in change.set and word != change.set[key]):
                    if origin is None:
                        raise UnsafeCmdline(
                            "/" + MAIN, f"{word} is built from several pieces; remove it by hand"
                        )
                    out.append((origin, word))
        return out

    def _edits(self, removals: list[Removal]) -> dict[str, str]:
        texts: dict[str, list[str]] = {}
        for origin, word in removals:
            lines = texts.setdefault(origin.path, (self._read(origin.path) or "").split("\n"))
            if not _remove_word(lines, origin, word):
                raise UnsafeCmdline(
                    f"{origin.path}:{origin.first}",
                    f"{word} must go but is not written there as a plain word; remove it by hand",
                )
        return {path.lstrip("/"): "\n".join(lines) for path, lines in texts.items()}

    def _check(
        self, override: dict[str, str | None], ours: list[str], drop: frozenset[str]
    ) -> None:
        """With our writes in place, the kernel must get our arguments and none dropped."""
        state = self.evaluate(override)
        words = [w for var in VARS for w, _ in state.words(var)]
        want = {key_of(a): a for a in ours}
        wrong = [w for w in words if key_of(w) in drop or want.get(key_of(w), w) != w]
        if not wrong and all(a in words for a in ours):
            return
        if self.ours_in == MAIN:
            raise UnsafeCmdline(
                "/" + MAIN,
                f"with our line appended, {' '.join(wrong) or 'not our arguments'} "
                "would reach the kernel",
            )
        later = [
            rel
            for rel in self._order(set(override))
            if rel > DROPIN and re.search(r"\bGRUB_CMDLINE_LINUX", self._read("/" + rel) or "")
        ]
        culprit = "/" + later[0] if later else "/" + DROPIN
        raise UnsafeCmdline(
            culprit,
            f"sorts after {DROPIN.rsplit('/', 1)[1]} and sets the command line so that "
            + (
                f"{' '.join(wrong)} would reach the kernel instead of ours"
                if wrong
                else f"{' '.join(a for a in ours if a not in words)} would not reach the kernel"
            ),
        )

    def actions(self, change: ArgChange) -> list[Action]:
        state = self.evaluate()
        ours = edit(self.ours(state), change)
        removals = self._removals(state, change)
        edits = self._edits(removals)
        writes = self._ours_written(edits, ours)
        self._check(writes, ours, change.drop)
        out: list[Action] = []
        for rel, new in writes.items():
            gone = " ".join(w for o, w in removals if o.path == "/" + rel)
            what = (f"removes {gone} where it was written; " if gone else "") + (
                "appends our kernel arguments" if ours and rel == self.ours_in else ""
            )
            if new is not None:
                out.append(WriteFile(rel, new.encode(), what.rstrip("; ") or "takes ours out"))
            elif self.root.exists(rel):
                out.append(RemoveFile(rel, "no kernel arguments of ours are needed any more"))
        grub = self.reading
        out.append(
            Run(grub.regenerate, "regenerate grub.cfg", touches=(grub.grub_cfg,), regenerate=True)
        )
        return out

    def _ours_written(self, edits: dict[str, str], ours: list[str]) -> dict[str, str | None]:
        """``edits`` with our appending line put where this host's grub-mkconfig reads it."""
        writes: dict[str, str | None] = dict(edits)
        if self.ours_in == DROPIN:
            writes[DROPIN] = dropin_text(ours) if ours else None
            return writes
        text = edits[MAIN] if MAIN in edits else self._read("/" + MAIN) or ""
        if with_block(text, ours) != self._read("/" + MAIN):
            writes[MAIN] = with_block(text, ours)
        return writes
