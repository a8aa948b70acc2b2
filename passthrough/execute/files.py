"""Small, careful file primitives: a crash leaves each file entirely old or entirely new.

apply, undo and the journal write through these; so does ``render -o``.
"""

from __future__ import annotations

import os

from passthrough.host.root import HostRoot


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, mode: int | None = None) -> None:
    """Write ``path`` so that a crash leaves either the old or the new content."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    tmp = os.path.join(directory, f".{os.path.basename(path)}.passthrough-tmp")
    # A fresh file, never whatever sits at that name (a link planted there would carry
    # the write out of the root): remove it, then create exclusively, links not followed.
    remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):
        return  # already absent
    fsync_dir(os.path.dirname(path))


def read_file(root: HostRoot, rel: str) -> bytes | None:
    """A file's bytes whatever its size, None when absent (or not a regular file)."""
    try:
        with open(root.real(rel), "rb") as fh:
            return fh.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
