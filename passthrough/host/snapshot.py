# SPDX-License-Identifier: Apache-2.0
"""Capturing a host: exactly what discovery reads, as a tar.gz of a host root.

A :class:`RecordingRoot` runs the ordinary discovery and remembers every file it read,
every link it followed and every directory it listed. The snapshot holds those and
nothing else, so ``passthrough scan --root <unpacked>`` on another machine gives the
same report. Inside a virtual machine it also keeps what ``passthrough guest check`` reads.
Binary config space is never read, so it is never captured; the full pci.ids is replaced by
the names the host's scan used.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from passthrough.errors import SnapshotError, echo_path
from passthrough.guest.root import SNAPSHOT_META
from passthrough.host.packages import DPKG_STATUS, dpkg_subset
from passthrough.host.pciids import PCI_IDS_PATHS, render_subset
from passthrough.host.root import MAX_FILE, HostRoot
from passthrough.host.unpack import unpack as unpack  # where readers of a snapshot look for it
from passthrough.model import Host


@dataclass
class _Seen:
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    markers: set[str] = field(default_factory=set)  # exists, content never read


class RecordingRoot(HostRoot):
    walk_live = True  # the live root too: every link followed must be seen

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.seen = _Seen()

    def _saw_link(self, rel: str, target: str) -> None:
        self.seen.links[rel] = target

    def _canon(self, rel: str) -> str:
        """``rel`` with every link in its parents resolved inside the root (the walk
        records each link it follows)."""
        parent, _, name = rel.strip("/").rpartition("/")
        if name in ("", ".", ".."):
            return self.contained(rel)
        base = self.contained(parent) if parent else ""
        return f"{base}/{name}" if base else name

    def _note(self, rel: str, content: bytes | None = None) -> None:
        try:
            canon = self._canon(rel)
        except OSError:
            return  # a link loop: nothing there to keep
        full = self._join(canon)
        if os.path.islink(full):
            self.seen.links[canon] = os.readlink(full)
        elif content is not None:
            self.seen.files[canon] = content
        elif os.path.isdir(full):
            self.seen.dirs.add(canon)
        elif os.path.lexists(full):
            self.seen.markers.add(canon)

    def read_bytes(self, rel: str, limit: int = MAX_FILE) -> bytes | None:
        data = super().read_bytes(rel, limit)
        if data is not None:
            # Read through links: the walk kept each one, the file lives at its real place.
            self.seen.files[self.contained(rel)] = data
        return data

    def resolve(self, rel: str) -> str | None:
        real = super().resolve(rel)
        if real:
            self._note(real)  # the place a link led to exists: keep it
        return real

    def readlink(self, rel: str) -> str | None:
        target = super().readlink(rel)
        if target is not None:
            self._note(rel)
        return target

    def exists(self, rel: str) -> bool:
        found = super().exists(rel)
        if found:
            self._note(rel)
        return found

    def isdir(self, rel: str) -> bool:
        found = super().isdir(rel)
        if found:
            self._note(rel)
        return found

    def isfile(self, rel: str) -> bool:
        # a loader entry's kernel: its presence decides whether the entry can boot, its
        # bytes are never read (kept as a marker)
        found = super().isfile(rel)
        if found:
            self._note(rel)
        return found

    def listdir(self, rel: str) -> list[str]:
        names = super().listdir(rel)
        if names or super().isdir(rel):
            self._note(rel)
            for name in names:
                self._note(f"{rel.strip('/')}/{name}")
        return names


def _add(
    tar: tarfile.TarFile, name: str, data: bytes | None = None, link: str | None = None
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = int(time.time())
    if link is not None:
        info.type = tarfile.SYMTYPE
        info.linkname = link
        tar.addfile(info)
    elif data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
    else:
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))


def write_snapshot(root: RecordingRoot, host: Host, out_path: str) -> dict[str, int]:
    """Write what ``root`` recorded while ``host`` was discovered."""
    seen = root.seen
    names: dict[tuple[int, int | None], str] = {}
    for f in host.functions:
        if f.vendor_name:
            names[(f.vendor_id, None)] = f.vendor_name
        if f.device_name:
            names[(f.vendor_id, f.device_id)] = f.device_name
    for rel in PCI_IDS_PATHS:
        seen.files.pop(rel, None)
        seen.markers.discard(rel)
    files = dict(seen.files)
    if DPKG_STATUS in files:
        # discovery wants a few packages' versions: the snapshot holds those, not the list
        # of everything installed (as pci.ids holds only the names the scan used)
        files[DPKG_STATUS] = dpkg_subset(host.packages).encode()
    if names:
        files["usr/share/misc/pci.ids"] = render_subset(names).encode()
    meta = {
        "schema": "passthrough.snapshot/v1",
        "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source_root": host.root,
        "problems": list(host.problems),
        # inside a VM it also holds what `guest check` reads (see host/recorded.py)
        "guest_check": host.machine.guest,
        # what virsh/qemu --version said on the live host where dpkg did not say
        "tool_versions": host.tool_versions,
    }
    files[SNAPSHOT_META] = (json.dumps(meta, indent=2) + "\n").encode()
    links = {k: v for k, v in seen.links.items() if k not in files}
    # Links whose parents are links themselves live at their resolved place; keep both.
    directory = os.path.dirname(os.path.abspath(out_path)) or "."
    if not os.path.isdir(directory):
        raise SnapshotError(f"cannot write {out_path}: no such directory {directory}")
    fd, tmp = tempfile.mkstemp(prefix=".snapshot-", suffix=".tar.gz", dir=directory)
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            written: set[str] = set()
            for d in sorted(seen.dirs):
                if d and d not in links and d not in files:
                    _add(tar, d)
                    written.add(d)
            for name, target in sorted(links.items()):
                _add(tar, name, link=_relative_target(name, target))
            for name, data in sorted(files.items()):
                if name in links:
                    continue
                _add(tar, name, data)
            for name in sorted(seen.markers - set(files) - set(links) - written):
                _add(tar, name, b"")
        os.replace(tmp, out_path)
    except OSError as exc:
        os.unlink(tmp)
        # the error names our temporary file; the user named out_path
        raise SnapshotError(f"cannot write {echo_path(out_path)}: {exc.strerror or exc}") from None
    except BaseException:
        os.unlink(tmp)
        raise
    return {
        "files": len(files),
        "links": len(links),
        "dirs": len(seen.dirs),
        "markers": len(seen.markers),
    }


def _relative_target(name: str, target: str) -> str:
    """A link target the archive can hold: relative, and never above the archive's top.

    An absolute target, or a relative one with more ``..`` than the link is deep, names
    (as a chroot reads it) a place from the root: it is written as that place relative
    to the link, so unpacking keeps every link inside and a scan reads the same files."""
    parent = name.split("/")[:-1]
    level = len(parent)  # how deep below the top the walk along the target is
    for part in target.split("/"):
        if part == "..":
            level -= 1
            if level < 0:
                break
        elif part not in ("", "."):
            level += 1
    if not target.startswith("/") and level >= 0:
        return target
    place: list[str] = [] if target.startswith("/") else list(parent)
    for part in target.split("/"):
        if part == "..":
            if place:
                place.pop()  # at the root, .. stays at the root
        elif part not in ("", "."):
            place.append(part)
    return "/".join([".."] * len(parent) + place) or "."


def capture(
    root_path: str, out_path: str, also: Callable[[HostRoot, Host], None] | None = None
) -> tuple[Host, dict[str, int]]:
    """Discover ``root_path`` through a recorder and write what was read to ``out_path``;
    ``also`` reads more through the same recorder first (what ``plan`` reads, for one)."""
    from passthrough.host.discover import discover, pci_source_for, root_pci_source

    recorder = RecordingRoot(root_path)
    source = pci_source_for(root_path)
    host = discover(recorder, pci_source=source)
    if source is not None:
        # pyudev read the PCI tree behind the recorder's back: read it again through it.
        root_pci_source(recorder)
    from passthrough.host.qemu import read_qemu
    from passthrough.host.recorded import record_guest_check

    read_qemu(recorder)  # what render reads: the emulator, firmware descriptors, SMT
    from passthrough.host.facts import read_thread_siblings

    read_thread_siblings(recorder, (c for cpus in host.numa_cpus.values() for c in cpus))
    if host.machine.guest:
        record_guest_check(recorder)
    elif also is not None:
        also(recorder, host)
    return host, write_snapshot(recorder, host, out_path)
