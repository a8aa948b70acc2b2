# SPDX-License-Identifier: Apache-2.0
"""GRUB (Debian/Ubuntu/Arch): our arguments as a delta on the admin's configuration.

grub-mkconfig sources /etc/default/grub, then every /etc/default/grub.d/*.cfg in sort
order. Our drop-in *appends* to ``GRUB_CMDLINE_LINUX_DEFAULT`` as the shell has it at that
point, so whatever the admin sets before it (today or after apply) still takes effect,
followed by ours. An argument that must go (``amd_iommu=on``, ``intel_iommu=off``, another
value of a key we set) is removed where the admin wrote it: that file is edited in place,
journaled like every write, and the plan shows the diff. Files sorting after ours are
sourced after ours: the plan is refused when, with them, our arguments would not be what
the kernel gets.
"""

from __future__ import annotations

import re

from passthrough.model import BootloaderKind
from passthrough.plan.actions import Action, RemoveFile, Run, WriteFile
from passthrough.plan.bootloader_base import Bootloader
from passthrough.plan.kargs import ArgChange, UnsafeCmdline, edit, key_of, utf8_text
from passthrough.plan.shellvars import Origin, ShellVars, quote, source

MAIN = "etc/default/grub"
GRUB_D = "etc/default/grub.d"
DROPIN = f"{GRUB_D}/99-passthrough.cfg"
VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
TARGET = "GRUB_CMDLINE_LINUX_DEFAULT"  # for normal boots; comes last on the kernel line
HEADER = (
    "# Written by passthrough (GPU passthrough kernel arguments); 'passthrough undo' removes it.\n"
    "# It appends to the value set before it: edit /etc/default/grub as usual.\n"
)

Removal = tuple[Origin, str]  # where an argument was written, and the argument


def dropin_text(args: list[str]) -> str:
    body = quote(" ".join(args))[1:-1]
    return HEADER + f'{TARGET}="${{{TARGET}}} {body}"\n'


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
    """A drop-in in /etc/default/grub.d that appends, then update-grub (or grub-mkconfig)."""

    name = BootloaderKind.GRUB
    DROPIN = DROPIN

    def _read(self, path: str) -> str | None:
        return utf8_text(self.root.read_bytes(path.lstrip("/")), path)

    def _order(self, extra: set[str]) -> list[str]:
        names = {n for n in self.root.listdir(GRUB_D) if n.endswith(".cfg")}
        names |= {p.rsplit("/", 1)[1] for p in extra if p.startswith(GRUB_D + "/")}
        # /bin/sh expands grub.d/*.cfg in byte order
        return [MAIN] + [f"{GRUB_D}/{n}" for n in sorted(names, key=lambda s: s.encode())]

    def evaluate(self, override: dict[str, str | None] | None = None) -> ShellVars:
        """The variables as grub-mkconfig ends with them (``override``: path → text)."""
        override = override or {}
        state = ShellVars(frozenset(VARS))
        if self.root.read_bytes(MAIN) is None and MAIN not in override:
            raise UnsafeCmdline("/" + MAIN, "missing, although GRUB was detected")
        for rel in self._order(set(override)):
            text = override[rel] if rel in override else self._read("/" + rel)
            if text is not None:
                source(text, "/" + rel, state, self._read)
        return state

    def configured(self) -> list[str]:
        state = self.evaluate()
        return [w for var in VARS for w, _ in state.words(var)]

    def ours(self, state: ShellVars) -> list[str]:
        return [w for w, o in state.words(TARGET) if o is not None and o.path == "/" + DROPIN]

    def _removals(self, state: ShellVars, change: ArgChange) -> list[Removal]:
        out: list[Removal] = []
        for var in VARS:
            for word, origin in state.words(var):
                key = key_of(word)
                if origin is not None and origin.path == "/" + DROPIN:
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
        text = dropin_text(ours) if ours else None
        self._check({**edits, DROPIN: text}, ours, change.drop)
        out: list[Action] = []
        for rel, new in edits.items():
            gone = " ".join(w for o, w in removals if o.path == "/" + rel)
            out.append(WriteFile(rel, new.encode(), f"removes {gone} where it was written"))
        if text is not None:
            out.append(WriteFile(DROPIN, text.encode(), "appends our kernel arguments"))
        elif self.root.exists(DROPIN):
            out.append(RemoveFile(DROPIN, "no kernel arguments of ours are needed any more"))
        argv = (
            ("update-grub",)
            if self._has("update-grub")
            else ("grub-mkconfig", "-o", "/boot/grub/grub.cfg")
        )
        out.append(
            Run(argv, "regenerate grub.cfg", touches=("boot/grub/grub.cfg",), regenerate=True)
        )
        return out

    def _has(self, tool: str) -> bool:
        return any(self.root.exists(f"{d}/{tool}") for d in ("usr/sbin", "sbin", "usr/bin"))
