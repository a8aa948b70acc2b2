"""A minimal reader of a guest root (``/`` or an unpacked capture), standard library only.

The host side has :class:`passthrough.host.root.HostRoot`; this package cannot import it
(it is shipped alone to guests as Ansible module_utils), so it carries the few reads it needs.
"""

from __future__ import annotations

import json
import os
import posixpath

# The metadata file `passthrough snapshot` writes at the top of a capture.
SNAPSHOT_META = "passthrough-snapshot.json"


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
        try:
            with open(os.path.join(self.path, SNAPSHOT_META), "rb") as f:
                meta = json.loads(f.read(1 << 16))
        except (OSError, ValueError):
            return False  # no snapshot of ours: a full copy of a root
        return not (isinstance(meta, dict) and meta.get("guest_check") is True)

    def abs(self, rel: str) -> str:
        return os.path.join(self.path, rel.lstrip("/"))

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.abs(rel))

    def isdir(self, rel: str) -> bool:
        return os.path.isdir(self.abs(rel))

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.abs(rel)))
        except OSError:
            return []

    def read(self, rel: str) -> str | None:
        try:
            with open(self.abs(rel), "rb") as f:
                return f.read(1 << 22).decode("utf-8", "replace").strip()
        except OSError:
            return None

    def mtime(self, rel: str) -> float | None:
        try:
            return os.stat(self.abs(rel)).st_mtime
        except OSError:
            return None

    def link_name(self, rel: str) -> str | None:
        try:
            return posixpath.basename(os.readlink(self.abs(rel)).rstrip("/"))
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
