# SPDX-License-Identifier: Apache-2.0
"""Unpacking a snapshot archive: contained (no member lands or writes outside the
directory) and bounded (see :data:`LIMITS`), so an archive from someone else can neither
write elsewhere nor fill the disk, the memory or the afternoon.

The bounds hold while the archive is read, never after: the decompressed stream is
counted as tarfile reads it (headers too, so a huge pax header or long name is cut off
as soon as it passes the budget), and each member is counted and measured before it is
written. A refusal names the limit it hit; whatever was unpacked is left in ``dest``,
which the caller removes.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import os
import tarfile
from collections.abc import Callable, Iterator

from passthrough.errors import SnapshotError, echo, echo_path, quote
from passthrough.records import frozen

MIB = 1 << 20


@frozen
class Limits:
    """What an archive may hold. A capture of a large host (an 8-GPU HGX sample) holds
    about 700 members, 9 levels deep, 0.5 MiB of tar at a compression ratio of 40."""

    members: int = 20_000
    bytes: int = 64 * MIB  # the uncompressed tar stream, headers and padding included
    depth: int = 64  # path components of a member's name
    ratio: int = 200  # uncompressed : compressed, checked once past ``ratio_floor``
    ratio_floor: int = 1 * MIB


LIMITS = Limits()


class _Over(SnapshotError):
    """An archive past one of the limits."""

    def __init__(self, archive: str, what: str) -> None:
        super().__init__(f"{echo_path(archive)}: {what}: refused (see docs/limits.md)")


class _Counted(io.RawIOBase):
    """The decompressed stream, counted as it is read; past a bound it raises."""

    def __init__(self, archive: str, inner: io.BufferedIOBase, packed: int, limits: Limits) -> None:
        self.archive, self.inner, self.limits = archive, inner, limits
        self.most = min(limits.bytes, max(limits.ratio_floor, limits.ratio * packed))
        self.seen = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.inner.read(min(len(buffer), self.most + 1 - self.seen))
        self.seen += len(data)
        if self.seen > self.most:
            lim = self.limits
            if self.most == lim.bytes:
                raise _Over(self.archive, f"more than {lim.bytes // MIB} MiB uncompressed")
            raise _Over(self.archive, f"expands more than {lim.ratio} times (a compression bomb?)")
        buffer[: len(data)] = data
        return len(data)


def _decompressed(path: str) -> io.BufferedIOBase:
    """The archive's bytes after gzip, bzip2 or xz (what ``tarfile`` reads), or as they are."""
    with open(path, "rb") as fh:
        magic = fh.read(6)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.open(path, "rb")
    if magic.startswith(b"BZh"):
        return bz2.open(path, "rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(path, "rb")
    return open(path, "rb")


def _kind(member: tarfile.TarInfo) -> str:
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device node"
    if member.isfifo():
        return "a FIFO"
    return "a special file"


def _refuse(archive: str, member: tarfile.TarInfo, why: str) -> SnapshotError:
    return SnapshotError(f"{echo_path(archive)}: unsafe member {quote(member.name)}: {why}")


def _bounded(archive: str, limits: Limits) -> Callable[[tarfile.TarInfo], None]:
    """Counts members and their sizes against ``limits`` before each is written."""
    count = total = 0

    def measure(member: tarfile.TarInfo) -> None:
        nonlocal count, total
        count += 1
        total += member.size
        if count > limits.members:
            raise _Over(archive, f"more than {limits.members} members")
        if len([p for p in member.name.split("/") if p]) > limits.depth:
            raise _Over(
                archive, f"member {quote(member.name, 80)} deeper than {limits.depth} levels"
            )
        if total > limits.bytes:
            raise _Over(archive, f"members larger than {limits.bytes // MIB} MiB in all")

    return measure


def _safe_member(
    archive: str, dest: str, limits: Limits = LIMITS
) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    """The standard library's ``data`` filter, and stricter where a snapshot allows it:
    only files, directories and symbolic links; no absolute name; and nothing written
    at or through a link already unpacked (a snapshot made by ``write_snapshot``
    stores every file at its real place), so no link can carry a later member out.
    Each member is also counted against ``limits``."""
    top = os.path.realpath(dest)
    measure = _bounded(archive, limits)

    def check(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        measure(member)
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


@contextlib.contextmanager
def _reading(archive: str, limits: Limits) -> Iterator[tarfile.TarFile]:
    """The archive as a tar stream, decompressed under the byte and ratio bounds."""
    try:
        packed = os.path.getsize(archive)
        with (
            _decompressed(archive) as inner,
            io.BufferedReader(_Counted(archive, inner, packed, limits)) as stream,
            tarfile.open(fileobj=stream, mode="r|") as tar,
        ):
            yield tar
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError) as exc:
        raise SnapshotError(
            # tarfile's message may list each method it tried, one per line: the first says it
            f"{echo_path(archive)}: not a readable snapshot ({echo(_first_line(str(exc)))})"
        ) from None


def unpack(archive: str, dest: str, limits: Limits = LIMITS) -> str:
    """Unpack a snapshot made by ``write_snapshot`` into ``dest`` (an empty directory).

    A first pass reads only the headers, so an archive past a limit is refused before
    anything is written. Then every member is checked just before it is written (links
    before it are on disk by then), so a refused archive stops with nothing written
    outside ``dest``. Both passes count the decompressed stream against ``limits``."""
    with _reading(archive, limits) as tar:
        measure = _bounded(archive, limits)
        for member in tar:
            measure(member)
    with _reading(archive, limits) as tar:
        check = _safe_member(archive, dest, limits)  # counted again: the file may have changed
        if HAS_DATA_FILTER:
            tar.extractall(dest, filter=check)
        else:
            for member in tar:  # each checked once the links before it are on disk
                tar.extract(check(member, dest), dest, set_attrs=member.isdir())
    return dest
