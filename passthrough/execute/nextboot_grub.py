# SPDX-License-Identifier: Apache-2.0
"""Which menuentry of grub.cfg the next boot takes, as GRUB picks it.

grub-mkconfig writes ``GRUB_DEFAULT`` into grub.cfg's header (00_header)::

    if [ "${next_entry}" ] ; then
       set default="${next_entry}"       (grub-reboot: the next boot only)
       ...
    else
       set default="<GRUB_DEFAULT>"      ("${saved_entry}" for GRUB_DEFAULT=saved)
    fi

GRUB then resolves ``default`` against the menu: a number is an entry's place (from 0), any
other word an entry's title or its ``--id`` (``$menuentry_id_option 'id'``), and ``>``
separates the steps of a path into submenus (``>>`` is a literal ``>``). An unset or
empty ``default`` (``saved`` before anything was saved) boots the first entry. The
variables come from ``$prefix/grubenv``, the environment block beside grub.cfg.

Whatever this reader cannot resolve exactly (a default naming no entry, a submenu rather
than an entry, a variable other than saved_entry/next_entry) is returned as a reason, so
that the check says it could not tell rather than judging another entry.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

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
