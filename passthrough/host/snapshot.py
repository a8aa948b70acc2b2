"""Capturing a host: exactly what discovery reads, as a tar.gz of a host root.

A :class:`RecordingRoot` runs the ordinary discovery and remembers every file it read,
every link it followed and every directory it listed. The snapshot holds those and
nothing else, so ``passthrough scan --root <unpacked>`` on another machine gives the
same report. Binary config space is never read, so it is never captured; the full
pci.ids is replaced by the names the host's scan used.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

from passthrough.errors import SnapshotError
from passthrough.host.pciids import PCI_IDS_PATHS, render_subset
from passthrough.host.root import HostRoot
from passthrough.model import Host

SNAPSHOT_META = "passthrough-snapshot.json"


@dataclass
class _Seen:
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    markers: set[str] = field(default_factory=set)  # exists, content never read


class RecordingRoot(HostRoot):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.seen = _Seen()

    def _canon(self, rel: str) -> str:
        """``rel`` with every link in its parents resolved (each link is recorded)."""
        rel = rel.strip("/")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            target = super().readlink(prefix)
            if target is not None:
                self.seen.links[prefix] = target
        parent = os.path.realpath(self.abs("/".join(parts[:-1]))) if len(parts) > 1 else self.path
        inside = parent == self.path or parent.startswith(self.path.rstrip("/") + "/")
        if not inside:
            return rel
        base = self.rel(parent)
        return f"{base}/{parts[-1]}" if base else parts[-1]

    def _note(self, rel: str, content: bytes | None = None) -> None:
        canon = self._canon(rel)
        full = self.abs(canon)
        if os.path.islink(full):
            self.seen.links[canon] = os.readlink(full)
        elif content is not None:
            self.seen.files[canon] = content
        elif os.path.isdir(full):
            self.seen.dirs.add(canon)
        elif os.path.lexists(full):
            self.seen.markers.add(canon)

    def read_bytes(self, rel: str, limit: int = 1 << 24) -> bytes | None:
        data = super().read_bytes(rel, limit)
        if data is not None:
            canon = self._canon(rel)
            if os.path.islink(self.abs(canon)):
                # A file read through a final link: keep the link and the real file.
                self.seen.links[canon] = os.readlink(self.abs(canon))
                real = os.path.realpath(self.abs(canon))
                if real.startswith(self.path.rstrip("/") + "/"):
                    self.seen.files[self.rel(real)] = data
                else:
                    del self.seen.links[canon]
                    self.seen.files[canon] = data
            else:
                self.seen.files[canon] = data
        return data

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
    if names:
        files["usr/share/misc/pci.ids"] = render_subset(names).encode()
    meta = {
        "schema": "passthrough.snapshot/v1",
        "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source_root": host.root,
        "problems": list(host.problems),
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
                _add(tar, name, link=target)
            for name, data in sorted(files.items()):
                if name in links:
                    continue
                _add(tar, name, data)
            for name in sorted(seen.markers - set(files) - set(links) - written):
                _add(tar, name, b"")
        os.replace(tmp, out_path)
    except BaseException:
        os.unlink(tmp)
        raise
    return {
        "files": len(files),
        "links": len(links),
        "dirs": len(seen.dirs),
        "markers": len(seen.markers),
    }


def unpack(archive: str, dest: str) -> str:
    """Unpack a snapshot made by :func:`write_snapshot` into ``dest``."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar.getmembers():
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    raise SnapshotError(f"{archive}: unsafe member {member.name!r}")
                if not (member.isfile() or member.isdir() or member.issym()):
                    raise SnapshotError(f"{archive}: unexpected member type for {member.name!r}")
            tar.extractall(dest)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SnapshotError(f"{archive}: not a readable snapshot ({exc})") from None
    return dest
