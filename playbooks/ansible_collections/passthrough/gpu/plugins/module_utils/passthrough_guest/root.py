# SPDX-License-Identifier: Apache-2.0
"""A minimal reader of a guest root (``/`` or an unpacked capture), standard library only.

The host side has :class:`passthrough.host.root.HostRoot`; this package cannot import it
(it is shipped alone to guests as Ansible module_utils), so it carries the few reads it needs,
contained by the same walk (:mod:`.contain`, which the host side imports from here): under a
root other than ``/`` every path is resolved one component at a time, an absolute link target
starting again at the root and ``..`` stopping there, so a capture's links can never make the
check read the checking machine's own files. Files are
opened non-blocking (a FIFO planted in a capture reads as empty instead of hanging).
"""

from __future__ import annotations

import json
import os
import posixpath
import stat

from .contain import parts, resolve

# The metadata file `passthrough snapshot` writes at the top of a capture.
SNAPSHOT_META = "passthrough-snapshot.json"
READ_LIMIT = 1 << 22


class GuestRoot:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.is_live = self.path == "/"
        # A snapshot that holds only what host discovery reads (taken by an older
        # passthrough): the driver's /proc files and /dev were never recorded, so their
        # absence says nothing about the guest.
        self.host_files_only = self._host_snapshot()

    def _host_snapshot(self) -> bool:
        if self.is_live:
            return False
        text = self.read(SNAPSHOT_META)
        try:
            meta = json.loads(text) if text else None
        except (ValueError, RecursionError):
            meta = None
        if meta is None:
            return False  # no snapshot of ours (or not one we can read): a full root copy
        return not (isinstance(meta, dict) and meta.get("guest_check") is True)

    def real(self, rel: str, follow_final: bool = True) -> str:
        """The path to open for ``rel``, resolved inside the root (see the module)."""
        if self.is_live:
            return "/" + rel.lstrip("/")
        here = resolve(self.path, parts(rel), follow_final, name=rel)[0]
        return os.path.join(self.path, here) if here else self.path

    def abs(self, rel: str) -> str:
        """How ``rel`` is named in messages (joined, not resolved)."""
        return os.path.join(self.path, rel.lstrip("/"))

    def exists(self, rel: str) -> bool:
        try:
            return os.path.lexists(self.real(rel, follow_final=False))
        except OSError:
            return False

    def isdir(self, rel: str) -> bool:
        try:
            return os.path.isdir(self.real(rel))
        except OSError:
            return False

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.real(rel)))
        except OSError:
            return []

    def read(self, rel: str) -> str | None:
        data = self.read_bytes(rel)
        return None if data is None else data.decode("utf-8", "replace").strip()

    def read_bytes(self, rel: str) -> bytes | None:
        """A regular file's bytes (at most ``READ_LIMIT``); None where it is not one."""
        try:
            fd = os.open(self.real(rel), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None  # a FIFO, device or socket planted where a file belongs
            chunks, size = [], 0
            while size < READ_LIMIT:
                chunk = os.read(fd, READ_LIMIT - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def link_name(self, rel: str) -> str | None:
        try:
            return posixpath.basename(os.readlink(self.real(rel, follow_final=False)).rstrip("/"))
        except OSError:
            return None


def find_root(path: str) -> str:
    """The root inside an unpacked archive: the directory itself, or its only subdirectory
    when the archive was made with one top-level folder (``root/sys/...``)."""
    if os.path.isdir(os.path.join(path, "sys")) or os.path.isdir(os.path.join(path, "proc")):
        return path
    entries = [e for e in os.listdir(path) if not e.startswith(".")]
    if len(entries) == 1 and os.path.isdir(os.path.join(path, entries[0])):
        return os.path.join(path, entries[0])
    return path
