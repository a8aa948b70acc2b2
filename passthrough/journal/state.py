# SPDX-License-Identifier: Apache-2.0
"""Our own state directory, ``ROOT/var/lib/passthrough``: the journal, the lock, backups.

Everything in it is ours and nothing of ours is elsewhere. ``var/lib/passthrough`` is
resolved inside the root like any path (as a chroot would: a link there may move our state
elsewhere in the root, never out of it); below it no component may be a link or anything
else we did not make (a link there would carry a write, a prune or a restore out of our
directory): such a directory is refused before anything changes. The directory is 0700 and
its files 0600 whatever the umask: backups hold the originals of configuration files, and
the journal names commands that a later apply runs again as root.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from passthrough.errors import PassthroughError
from passthrough.host.root import HostRoot
from passthrough.journal import files

STATE = "var/lib/passthrough"
JOURNAL = f"{STATE}/journal.json"
BACKUPS = f"{STATE}/backups"
LOCK = f"{STATE}/lock"
PRIVATE = 0o700  # the state directory and every directory in it
JOURNAL_LIMIT = 64 << 20  # far more than any journal we write


class UnsafeState(PassthroughError):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"{path}: {why}, in our state directory (it must hold only real files and "
            "directories): move it aside and run the command again; nothing was changed"
        )
        self.path = path


class Busy(PassthroughError):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"another apply or undo is running (lock held on {path}); try again when it ends"
        )


def own(root: HostRoot, rel: str) -> str:
    """The absolute path of ``rel`` (``STATE`` or below it). ``STATE`` itself is resolved
    inside the root as a chroot would; below it, no existing component may be a link (nor
    anything but a directory, where a directory belongs)."""
    if rel != STATE and not rel.startswith(STATE + "/"):
        raise ValueError(f"{rel} is not in our state directory")
    top = root.real(STATE)
    parts = rel.split("/")[3:]
    here = top
    for i, part in enumerate(parts):
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except (FileNotFoundError, NotADirectoryError):
            break
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeState(here, "a symbolic link")
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise UnsafeState(here, "not a directory")
    return os.path.join(top, *parts)


def ensure_dir(root: HostRoot, rel: str) -> str:
    """Our directory ``rel`` (``STATE`` or below), made 0700 (the parents of ``STATE``
    0755) whatever the umask, and brought back to 0700 if an older version left it wider
    (not where ``STATE`` is a link: the directory it names may not be ours alone)."""
    path = own(root, rel)
    todo = files.missing_dirs(path)
    state = own(root, STATE)
    files.make_dirs([d for d in todo if len(d) < len(state)], 0o755)
    files.make_dirs([d for d in todo if len(d) >= len(state)], PRIVATE)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeState(path, "not a directory")
    linked = rel == STATE and os.path.islink(root.real(STATE, follow_final=False))
    if st.st_mode & 0o7777 != PRIVATE and not linked:
        files.fault_point("chmod", path)
        os.chmod(path, PRIVATE)
    return path


@contextmanager
def locked(root: HostRoot) -> Iterator[None]:
    """The state directory made (see :func:`ensure_dir`) and its lock held."""
    ensure_dir(root, STATE)
    path = own(root, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(path) from None
        if os.fstat(fd).st_mode & 0o7777 != 0o600:
            os.fchmod(fd, 0o600)
        yield
    finally:
        os.close(fd)


def full_os(root: HostRoot) -> bool:
    """A tree commands can run in (through chroot): a shell and env."""
    return root.exists("usr/bin/env") and (root.exists("bin/sh") or root.exists("usr/bin/sh"))
