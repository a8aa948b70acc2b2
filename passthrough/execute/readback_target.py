# SPDX-License-Identifier: Apache-2.0
"""Which grub.cfg the read-back reads: the one the regeneration command wrote.

A root can hold more than one grub.cfg (a leftover /boot/grub/grub.cfg beside the
/boot/grub2/grub.cfg that grub2-mkconfig writes on openSUSE and Fedora): reading whichever
is found first would check a file the next boot never reads. So the path comes from the
command itself:

- ``grub-mkconfig``/``grub2-mkconfig``: its ``-o``/``--output`` operand (without one it
  writes to its standard output, and nothing on disk is what it made);
- ``update-grub``/``update-grub2`` (Debian's wrappers): /boot/grub/grub.cfg, the file they
  hand to ``grub-mkconfig -o``.

A command of another name, or an output that is not an absolute path, is a target that
cannot be told: the read-back names it as not checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from passthrough.errors import MalformedHostData
from passthrough.host.root import HostRoot

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
