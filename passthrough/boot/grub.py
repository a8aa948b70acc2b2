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
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from passthrough.actions import Action, PlanRecord, RemoveFile, Run, WriteFile
from passthrough.boot.base import Bootloader
from passthrough.boot.readback import NextBoot, lacking
from passthrough.boot.shell_refuse import one_line
from passthrough.boot.shellvalue import Origin, ShellVars
from passthrough.boot.shellvars import append_missing, is_our_line, source
from passthrough.errors import MalformedHostData, PassthroughError
from passthrough.host.boot import read_grub
from passthrough.host.root import HostRoot
from passthrough.kargs import ArgChange, UnsafeCmdline, edit, key_of, utf8_text
from passthrough.model import BootloaderKind, GrubReading

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


def check_grub(root: HostRoot, record: PlanRecord, out: NextBoot) -> None:
    # the file the regeneration wrote (its -o, update-grub's), never a guess among places
    target, why = grub_target(out.ran, read_grub(root).regenerate)
    for rel in [target] if target else []:
        text, grubenv, unread = read_cfg(root, rel)
        if text is None:
            out.unchecked.append(unread)
            return
        choice = choose(text, grubenv)
        if choice.args is None:
            # a grub.cfg that reads BLS entries (blscfg), a default naming no entry or a
            # submenu: not ours to guess, and named as not checked
            out.unchecked.append(f"/{rel} (could not tell which entry boots: {choice.unclear})")
            return
        if gone := lacking(choice.args, record):
            out.missing.append(f"/{rel} ({choice.entry}): {' '.join(gone)}")
        out.checked.append("/" + rel)
        return
    out.unchecked.append(why)


# -- which grub.cfg is read back: the one the regeneration wrote ---------------------------
# Which grub.cfg the read-back reads: the one the regeneration command wrote.
#
# A root can hold more than one grub.cfg (a leftover /boot/grub/grub.cfg beside the
# /boot/grub2/grub.cfg that grub2-mkconfig writes on openSUSE and Fedora): reading whichever
# is found first would check a file the next boot never reads. So the path comes from the
# command itself:
#
# - ``grub-mkconfig``/``grub2-mkconfig``: its ``-o``/``--output`` operand (without one it
#   writes to its standard output, and nothing on disk is what it made);
# - ``update-grub``/``update-grub2`` (Debian's wrappers): /boot/grub/grub.cfg, the file they
#   hand to ``grub-mkconfig -o``.
#
# A command of another name, or an output that is not an absolute path, is a target that
# cannot be told: the read-back names it as not checked.

MKCONFIG = ("grub-mkconfig", "grub2-mkconfig")
WRAPPERS = {"update-grub": "boot/grub/grub.cfg", "update-grub2": "boot/grub/grub.cfg"}


def is_grub_regeneration(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0].rsplit("/", 1)[-1] in (*MKCONFIG, *WRAPPERS)


def _output(args: Sequence[str]) -> str | None:
    """The ``-o FILE``, ``-oFILE``, ``--output=FILE`` or ``--output FILE`` of grub-mkconfig
    (the last one wins, as getopt reads them)."""
    out: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-o", "--output"):
            out = args[i + 1] if i + 1 < len(args) else None
            i += 2
            continue
        if arg.startswith("--output="):
            out = arg.split("=", 1)[1]
        elif arg.startswith("-o"):
            out = arg[2:]
        i += 1
    return out


def grub_cfg_written(argv: Sequence[str]) -> tuple[str | None, str]:
    """(the grub.cfg ``argv`` writes, relative to the root; or None and why not)."""
    name = argv[0].rsplit("/", 1)[-1] if argv else ""
    if name in WRAPPERS:
        return WRAPPERS[name], ""
    if name not in MKCONFIG:
        return None, f"{' '.join(argv) or 'no command'} is not a GRUB regeneration"
    out = _output(argv[1:])
    if not out:
        return None, f"{name} ran without -o: what it wrote is not on disk"
    if not out.startswith("/") or "/../" in out + "/":
        return None, f"{name} wrote {out!r}, not an absolute path"
    return out.lstrip("/"), ""


def grub_target(ran: Sequence[Sequence[str]], planned: Sequence[str]) -> tuple[str | None, str]:
    """The grub.cfg the next boot reads: the output of the last GRUB regeneration that ran
    (``ran``), or of the one the plan runs on this root (``planned``) where none of ``ran``
    is one (an earlier apply regenerated it)."""
    grub = [a for a in ran if is_grub_regeneration(a)]
    argv = grub[-1] if grub else planned
    target, why = grub_cfg_written(argv)
    if target is None:
        return None, f"grub.cfg (could not tell which file the regeneration wrote: {why})"
    return target, ""


def read_cfg(root: HostRoot, rel: str) -> tuple[str | None, str | None, str]:
    """(grub.cfg's text, the grubenv beside it, why grub.cfg is not read): a file past the
    most one read takes is named as not read (apply has written everything by now: no
    refusal that says nothing changed)."""
    try:
        text = root.read(rel)
        if text is None:
            return None, None, f"/{rel} (the regeneration's output is not there)"
        return text, root.read(rel.rsplit("/", 1)[0] + "/grubenv"), ""
    except MalformedHostData as exc:
        return None, None, f"/{rel} (not read: {exc})"


# -- what the next boot reads: grub.cfg's default entry ------------------------------------
# Which menuentry of grub.cfg the next boot takes, as GRUB picks it.
#
# grub-mkconfig writes ``GRUB_DEFAULT`` into grub.cfg's header (00_header)::
#
#     if [ "${next_entry}" ] ; then
#        set default="${next_entry}"       (grub-reboot: the next boot only)
#        ...
#     else
#        set default="<GRUB_DEFAULT>"      ("${saved_entry}" for GRUB_DEFAULT=saved)
#     fi
#
# GRUB then resolves ``default`` against the menu: a number is an entry's place (from 0), any
# other word an entry's title or its ``--id`` (``$menuentry_id_option 'id'``), and ``>``
# separates the steps of a path into submenus (``>>`` is a literal ``>``). An unset or
# empty ``default`` (``saved`` before anything was saved) boots the first entry. The
# variables come from ``$prefix/grubenv``, the environment block beside grub.cfg.
#
# Whatever this reader cannot resolve exactly (a default naming no entry, a submenu rather
# than an entry, a variable other than saved_entry/next_entry) is returned as a reason, so
# that the check says it could not tell rather than judging another entry.

LINUX_COMMANDS = ("linux", "linuxefi", "linux16")
ID_OPTIONS = ("$menuentry_id_option", "${menuentry_id_option}", "--id")


@dataclass
class Item:
    """A menuentry (``children`` None) or a submenu of grub.cfg."""

    title: str
    id: str | None
    linux: list[str] | None = None  # the arguments of its first linux line
    children: list[Item] | None = None


@dataclass
class Menu:
    items: list[Item] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)  # each top-level `set default=` value


@dataclass
class Choice:
    """The entry the next boot takes, or why that cannot be told."""

    args: list[str] | None = None
    entry: str = ""  # "'Debian GNU/Linux'", for messages
    unclear: str | None = None


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return []  # an unbalanced quote in a script line: no menu line


def _item(words: list[str]) -> Item:
    title = words[1] if len(words) > 1 else ""
    ident = None
    for i, word in enumerate(words[2:], 2):
        if word.startswith("--id="):
            ident = word.split("=", 1)[1]
        elif word in ID_OPTIONS and i + 1 < len(words) and words[i + 1] != "{":
            ident = words[i + 1]
    return Item(title, ident, children=[] if words[0] == "submenu" else None)


def parse(text: str) -> Menu:
    """The menu tree of grub.cfg and its top-level ``set default=`` values."""
    menu = Menu()
    # each open block: the item it is (a menuentry or submenu), or None (function, other)
    stack: list[Item | None] = []
    for line in text.split("\n"):
        words = _words(line)
        if not words:
            continue
        head = words[0]
        inside = next((s for s in reversed(stack) if s is not None), None)
        if head in ("menuentry", "submenu"):
            item = _item(words)
            if inside is None:
                menu.items.append(item)
            elif inside.children is not None:
                inside.children.append(item)
            stack.append(item)
        elif head == "}" and stack:
            stack.pop()
        elif words[-1] == "{":
            stack.append(None)
        elif inside is not None and inside.children is None:
            if head in LINUX_COMMANDS and inside.linux is None:
                inside.linux = words[2:]
        elif not stack and head == "set" and len(words) > 1 and words[1].startswith("default="):
            menu.defaults.append(words[1].split("=", 1)[1])
    return menu


def read_env(text: str | None) -> dict[str, str]:
    """The variables of a GRUB environment block (``name=value`` lines, ``#`` padding)."""
    out: dict[str, str] = {}
    for line in (text or "").split("\n"):
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


def steps(default: str) -> list[str]:
    """The steps of a default's path: ``>`` separates them, ``>>`` is a literal ``>``.
    Linear in the length: each piece is sliced once, never built a character at a time."""
    out: list[str] = []
    current: list[str] = []
    i = 0
    while (j := default.find(">", i)) >= 0:
        current.append(default[i:j])
        if default.startswith(">>", j):
            current.append(">")
            i = j + 2
        else:
            out.append("".join(current))
            current, i = [], j + 1
    current.append(default[i:])
    return [*out, "".join(current)]


def _find(items: list[Item], step: str) -> Item | None:
    # an entry's place: ASCII digits only (``²`` is a digit to str.isdigit, not to GRUB),
    # and a number longer than any menu (thousands of digits) names no entry
    if step.isascii() and step.isdigit():
        digits = step.lstrip("0") or "0"
        return items[int(digits)] if len(digits) <= 9 and int(digits) < len(items) else None
    return next((i for i in items if step in (i.title, i.id)), None)


def _shown(value: str, most: int = 80) -> str:
    """``value`` quoted for a message, cut to ``most`` characters (a default can be MiBs)."""
    return repr(value) if len(value) <= most else repr(value[:most]) + f"... ({len(value)} chars)"


def default_value(menu: Menu, env: dict[str, str]) -> tuple[str | None, str | None]:
    """(the value of ``default`` at boot, why it cannot be told): the header's last
    literal, its ``${saved_entry}`` from grubenv, or grubenv's next_entry where the header
    reads it first."""
    if not menu.defaults:
        return "", None  # unset: the first entry
    if "${next_entry}" in menu.defaults and env.get("next_entry"):
        return env["next_entry"], None
    value = [d for d in menu.defaults if d != "${next_entry}"][-1:] or [""]
    (last,) = value
    if last in ("${saved_entry}", "$saved_entry"):
        return env.get("saved_entry", ""), None
    if "$" in last:
        return None, f"default is set from {_shown(last)[1:-1]}"
    return last, None


def choose(text: str, grubenv: str | None) -> Choice:
    """The entry GRUB boots from grub.cfg ``text`` with environment block ``grubenv``."""
    menu = parse(text)
    if not menu.items:
        return Choice(unclear="it has no menuentry")
    value, why = default_value(menu, read_env(grubenv))
    if value is None:
        return Choice(unclear=why)
    if value == "":
        item: Item | None = menu.items[0]
        label = "first menuentry"
    else:
        items: list[Item] | None = menu.items
        item = None
        for step in steps(value):
            item = _find(items, step) if items is not None else None
            if item is None:
                return Choice(unclear=f"default {_shown(value)} names no entry of it")
            items = item.children
        label = f"default {_shown(value)}"
    assert item is not None
    if item.children is not None:
        return Choice(unclear=f"{label} is a submenu ({item.title!r}), not an entry")
    if item.linux is None:
        return Choice(unclear=f"{label} ({item.title!r}) has no linux line")
    return Choice(args=item.linux, entry=f"{label}, {item.title!r}")
