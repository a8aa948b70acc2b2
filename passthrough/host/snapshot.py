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

from passthrough.errors import SnapshotError, echo, quote
from passthrough.guest.root import SNAPSHOT_META
from passthrough.host.packages import DPKG_STATUS, dpkg_subset
from passthrough.host.pciids import PCI_IDS_PATHS, render_subset
from passthrough.host.root import HostRoot
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

    def read_bytes(self, rel: str, limit: int = 1 << 24) -> bytes | None:
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
        raise SnapshotError(f"cannot write {echo(out_path)}: {exc.strerror or exc}") from None
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


def _kind(member: tarfile.TarInfo) -> str:
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device node"
    if member.isfifo():
        return "a FIFO"
    return "a special file"


def _refuse(archive: str, member: tarfile.TarInfo, why: str) -> SnapshotError:
    return SnapshotError(f"{echo(archive)}: unsafe member {quote(member.name)}: {why}")


def _safe_member(archive: str, dest: str) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    """The standard library's ``data`` filter, and stricter where a snapshot allows it:
    only files, directories and symbolic links; no absolute name; and nothing written
    at or through a link already unpacked (a snapshot made by :func:`write_snapshot`
    stores every file at its real place), so no link can carry a later member out."""
    top = os.path.realpath(dest)

    def check(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        if not (member.isfile() or member.isdir() or member.issym()):
            raise _refuse(archive, member, f"{_kind(member)}, not a file, directory or link")
        if member.name.startswith("/"):
            raise _refuse(archive, member, "an absolute name")
        if HAS_DATA_FILTER:
            try:
                checked = tarfile.data_filter(member, path)
            except tarfile.FilterError as exc:
                raise _refuse(archive, member, _filter_reason(exc)) from None
        else:
            checked = _own_data_checks(archive, member, top)
        where = top
        for part in checked.name.split("/"):
            where = os.path.join(where, part)
            if os.path.islink(where):
                raise _refuse(archive, member, "it would be written through a link")
        return checked

    return check


# Extraction filters came with Python 3.11.4 / 3.12; older interpreters (Debian 12's
# /usr/bin/python3 is 3.11.2, and the guest check runs there) get the same checks here.
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


def _own_data_checks(archive: str, member: tarfile.TarInfo, top: str) -> tarfile.TarInfo:
    """What the ``data`` filter refuses, for interpreters without it: a name or a link
    target that leaves ``top``, an absolute link target."""

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return real == top or real.startswith(top.rstrip("/") + "/")

    if not inside(os.path.join(top, member.name)):
        raise _refuse(archive, member, "it would land outside the snapshot")
    if member.issym():
        if member.linkname.startswith("/"):
            raise _refuse(archive, member, "a link to an absolute path")
        target = os.path.join(top, os.path.dirname(member.name), member.linkname)
        if not inside(target):
            raise _refuse(archive, member, "a link pointing outside the snapshot")
    return member


def _filter_reason(exc: tarfile.FilterError) -> str:
    if isinstance(exc, tarfile.AbsoluteLinkError):
        return "a link to an absolute path"
    if isinstance(exc, tarfile.LinkOutsideDestinationError):
        return "a link pointing outside the snapshot"
    if isinstance(exc, tarfile.OutsideDestinationError):
        return "it would land outside the snapshot"
    if isinstance(exc, tarfile.SpecialFileError):
        return "a special file"
    if isinstance(exc, tarfile.AbsolutePathError):
        return "an absolute name"
    return type(exc).__name__


def _first_line(text: str) -> str:
    lines = [line.strip(" -") for line in text.splitlines() if line.strip(" -")]
    return " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines or [text])[0]


def unpack(archive: str, dest: str) -> str:
    """Unpack a snapshot made by :func:`write_snapshot` into ``dest`` (an empty directory).

    Every member is checked just before it is written (links before it are on disk by
    then), so a refused archive stops with nothing written outside ``dest``."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            if HAS_DATA_FILTER:
                tar.extractall(dest, filter=_safe_member(archive, dest))
            else:
                check = _safe_member(archive, dest)
                for member in tar:  # each checked once the links before it are on disk
                    tar.extract(check(member, dest), dest, set_attrs=member.isdir())
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SnapshotError(
            # tarfile's message may list each method it tried, one per line: the first says it
            f"{echo(archive)}: not a readable snapshot ({echo(_first_line(str(exc)))})"
        ) from None
    return dest


def capture(
    root_path: str, out_path: str, also: Callable[[HostRoot, Host], None] | None = None
) -> tuple[Host, dict[str, int]]:
    """Discover ``root_path`` through a recorder and write what was read to ``out_path``;
    ``also`` reads more through the same recorder first (what ``plan`` reads, for one)."""
    from passthrough.host.discover import discover, pci_source_for, root_pci_source

    recorder: list[RecordingRoot] = []

    def factory(path: str) -> RecordingRoot:
        r = RecordingRoot(path)
        recorder.append(r)
        return r

    source = pci_source_for(root_path)
    host = discover(root_path, pci_source=source, root_factory=factory)
    if source is not None:
        # pyudev read the PCI tree behind the recorder's back: read it again through it.
        root_pci_source(recorder[0])
    from passthrough.host.recorded import record_guest_check

    if host.machine.guest:
        record_guest_check(recorder[0])
    elif also is not None:
        also(recorder[0], host)
    return host, write_snapshot(recorder[0], host, out_path)
