# SPDX-License-Identifier: Apache-2.0
"""Resolving a path inside a root the way a chroot would, standard library only: the one
containment walk of the host side (``passthrough.host.root.HostRoot``) and the guest checks
(``GuestRoot``, which travel alone to guests as Ansible module_utils).

A path is walked one component at a time: a link's absolute target starts again at the root,
``..`` never climbs above it, so no link under the root (a snapshot, a capture, a mounted
disk image) can make the reader open the reading machine's own files or write outside the
tree. Past :data:`MAX_LINK_HOPS` links the walk fails with ELOOP, as the kernel does.
"""

from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

MAX_LINK_HOPS = 40  # the kernel's own limit (ELOOP)


def parts(path: str) -> list[str]:
    """The components of ``path`` still to walk, last first (the order :func:`resolve` pops)."""
    return [p for p in reversed(path.split("/")) if p and p != "."]


def resolve(
    base: str,
    todo: list[str],
    follow_final: bool = True,
    *,
    name: str,
    here: str = "",
    hops: int = 0,
    plain_dirs: set[str] | None = None,
    saw_link: Callable[[str, str], None] | None = None,
    as_dir: bool = False,
) -> tuple[str, bool, int]:
    """Walk ``todo`` (components, last first: :func:`parts`) inside the root ``base`` (``""``
    for ``/``), from ``here``, a prefix already resolved (relative to the root, no link in
    it) that took ``hops`` links to reach. Returns (the path relative to the root with no
    link in it, except a final one when ``follow_final`` is false; whether every component
    existed; the links followed in all).

    ``name``: the path as the ELOOP error names it. ``plain_dirs``: a cache of components
    known to be real directories (skipped without a readlink; filled as the walk finds them
    while more components follow, or for the last one when ``as_dir``: it is walked through
    later). ``saw_link(component, target)``: told of each link followed."""
    complete = True
    while todo:
        part = todo.pop()
        if part == "..":
            here = here.rpartition("/")[0]  # at the root, stays at the root
            continue
        candidate = f"{here}/{part}" if here else part
        if plain_dirs is not None and (todo or follow_final) and candidate in plain_dirs:
            here = candidate  # a directory seen before: following it is a no-op
            continue
        full = f"{base}/{candidate}"
        if not todo and not follow_final:
            complete = complete and os.path.lexists(full)
            here = candidate
            break
        try:
            target = os.readlink(full)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                complete = False
            elif exc.errno == errno.EINVAL and plain_dirs is not None and (todo or as_dir):
                plain_dirs.add(candidate)
            # EINVAL: not a link; anything else: the open that follows reports it
            here = candidate
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
        if saw_link is not None:
            saw_link(candidate, target)
        if target.startswith("/"):
            here = ""
        todo.extend(parts(target))
    return here, complete, hops
