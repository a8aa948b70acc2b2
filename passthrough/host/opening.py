# SPDX-License-Identifier: Apache-2.0
"""Opening a ``--root`` argument: a directory as it is, a snapshot archive unpacked to a
temporary directory first. Here, below the CLI, so the validator's ``--host-root`` and the
commands share it without an upward import."""

from __future__ import annotations

import os
from contextlib import ExitStack

from passthrough.errors import NotAHostRoot, ReadOnlyRoot

# unpacked directory -> the archive the user named: what output calls the root
_UNPACKED: dict[str, str] = {}


def shown_root(path: str) -> str:
    """The root as the user named it: the snapshot archive, not the temporary directory it
    was unpacked into (which is gone when the command ends)."""
    return _UNPACKED.get(path, path)


def open_root(path: str, stack: ExitStack, changing: str | None = None) -> str:
    """A .tar.gz snapshot is unpacked to a temporary directory, which ``stack`` removes when
    it closes; a command that changes the host (``changing`` names it) refuses one."""
    if os.path.isfile(path) and path.endswith((".tar.gz", ".tgz", ".tar")):
        if changing:
            raise ReadOnlyRoot(changing, path)
        import shutil
        import tempfile

        from passthrough.guest.root import find_root
        from passthrough.host.snapshot import unpack

        tmp = tempfile.mkdtemp(prefix="passthrough-root-")
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        # a snapshot holds the root at its top; a copy made with tar may hold it in one folder
        top = find_root(unpack(path, tmp))
        if not os.path.isdir(os.path.join(top, "sys")) and not os.path.isdir(
            os.path.join(top, "proc")
        ):
            raise NotAHostRoot(
                path, "the archive holds no sys/ or proc/ (at its top or in one folder)"
            )
        _UNPACKED[top] = _UNPACKED[os.path.abspath(top)] = os.path.abspath(path)
        return top
    return path
