# SPDX-License-Identifier: Apache-2.0
"""Small, careful file primitives: a crash leaves each file entirely old or entirely new.

apply, undo and the journal write through these; so does ``render -o``. Every write is
checked to the last byte (a short write or a full disk raises), made durable (fsync of
the file, then of its directory after the rename) and carries the modes we mean whatever
the caller's umask. A file we rewrite keeps its mode, owner, group and extended
attributes. A temporary file is removed when its write fails; one left by a killed
process is removed by the next apply or undo (:func:`remove_temp`).

Every change to a tree passes through :func:`fault_point`, where the test harness
(tests/test_faults.py) injects a full disk or a SIGKILL (``PASSTHROUGH_FAULT``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import stat
from dataclasses import dataclass, field

from passthrough.errors import MalformedHostData, echo_path
from passthrough.host.root import MAX_FILE, HostRoot
from passthrough.records import frozen

FAULT_ENV = "PASSTHROUGH_FAULT"
# The points where a full disk can strike: everything that allocates.
ALLOCATING = frozenset({"create", "write", "fsync", "mkdir", "setxattr", "rename"})
TEMP_SUFFIX = ".passthrough-tmp"
log = logging.getLogger(__name__)  # -v: each file written or removed (cli/common.py)


@dataclass
class Faults:
    """``kill:N`` (SIGKILL at the N-th change to the tree), ``enospc:N`` (ENOSPC at the N-th
    allocating change) or ``count``: only count them. Off unless the variable is set."""

    kind: str = ""
    at: int = 0
    seen: int = 0
    allocating: int = 0
    log: list[tuple[str, str]] = field(default_factory=list)  # count: (what, path) in order

    @classmethod
    def from_env(cls) -> Faults:
        m = re.fullmatch(r"(kill|enospc):(\d+)|(count)", os.environ.get(FAULT_ENV, ""))
        if not m:
            return cls()
        return cls(m.group(1) or "count", int(m.group(2) or 0))


FAULTS = Faults.from_env()


def fault_point(what: str, path: str) -> None:
    """Called before every change to a tree (see the module's docstring)."""
    f = FAULTS
    if not f.kind:
        return
    f.seen += 1
    if f.kind == "count":
        f.log.append((what, path))
    if what in ALLOCATING:
        f.allocating += 1
    if f.kind == "kill" and f.seen == f.at:
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "enospc" and what in ALLOCATING and f.allocating == f.at:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


@frozen
class Attrs:
    """What a file carries besides its bytes. ``uid``/``gid`` None: whoever writes it."""

    mode: int
    uid: int | None = None
    gid: int | None = None
    xattrs: dict[str, bytes] = field(default_factory=dict)


def xattrs_of(path: str) -> dict[str, bytes]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
        return {n: os.getxattr(path, n, follow_symlinks=False) for n in names}
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.ENOENT):
            return {}
        raise


def attrs_of(path: str) -> Attrs | None:
    """A regular file's attributes (links not followed), None when there is none."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return Attrs(st.st_mode & 0o7777, st.st_uid, st.st_gid, xattrs_of(path))


def fsync_dir(path: str) -> None:
    fault_point("fsync", path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, path: str) -> None:
    view = memoryview(data)
    while view:
        fault_point("write", path)
        n = os.write(fd, view)
        if n <= 0:  # the kernel took nothing: the filesystem is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        view = view[n:]


def _carry(fd: int, attrs: Attrs, path: str) -> None:
    if attrs.uid is not None and attrs.gid is not None:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (attrs.uid, attrs.gid):
            fault_point("chown", path)
            os.fchown(fd, attrs.uid, attrs.gid)
    fault_point("chmod", path)
    os.fchmod(fd, attrs.mode)  # after chown, which clears set-id bits; never the umask's
    for name, value in attrs.xattrs.items():
        fault_point("setxattr", path)
        try:
            os.setxattr(fd, name, value)
        except OSError as exc:
            # security.* / trusted.* need privileges some callers lack; the rest is real
            if exc.errno not in (errno.EPERM, errno.EACCES, errno.ENOTSUP):
                raise


def temp_of(path: str) -> str:
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{TEMP_SUFFIX}")


def atomic_write(
    path: str, data: bytes, mode: int = 0o644, attrs: Attrs | None = None, keep: bool = True
) -> None:
    """Write ``path`` so that a crash leaves either the old or the new content. Its
    attributes: ``attrs`` when given; else, with ``keep``, those of the file it replaces;
    else ``mode``, owned by the caller. The directory must exist."""
    if attrs is None:
        attrs = (attrs_of(path) if keep else None) or Attrs(mode)
    tmp = temp_of(path)
    # A fresh file, never whatever sits at that name (a link planted there would carry
    # the write out of the root): remove it, then create exclusively, links not followed.
    remove_temp(path)
    try:
        _write_temp(tmp, path, data, attrs)
        fault_point("rename", path)
        os.replace(tmp, path)
    except OSError as exc:
        _unlink_quietly(tmp)
        # os.write and os.fsync name no file, os.open the temporary one: name the target
        raise OSError(exc.errno, exc.strerror, path) from None
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(os.path.dirname(path))
    log.info("wrote %s (%d bytes, mode %o)", path, len(data), attrs.mode)


def _write_temp(tmp: str, path: str, data: bytes, attrs: Attrs) -> None:
    fault_point("create", tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data, path)
        _carry(fd, attrs, path)
        fault_point("fsync", path)
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def remove_temp(path: str) -> None:
    """Remove the temporary file a write of ``path`` may have left (killed mid-write)."""
    tmp = temp_of(path)
    if os.path.lexists(tmp):
        fault_point("unlink", tmp)
        _unlink_quietly(tmp)


def remove(path: str) -> None:
    try:
        fault_point("unlink", path)
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):
        return  # already absent
    fsync_dir(os.path.dirname(path))
    log.info("removed %s", path)


def missing_dirs(directory: str) -> list[str]:
    """The directories that do not exist yet on the way to ``directory``, outermost first."""
    out: list[str] = []
    while directory and not os.path.lexists(directory):
        out.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return out[::-1]


def make_dirs(dirs: list[str], mode: int = 0o755) -> None:
    """Create ``dirs`` (outermost first) with ``mode`` whatever the umask; durable."""
    for d in dirs:
        fault_point("mkdir", d)
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            if not os.path.isdir(d) or os.path.islink(d):
                raise
            continue  # a cut-off run made it: ours all the same
        fault_point("chmod", d)
        os.chmod(d, mode)
        fsync_dir(os.path.dirname(d))


def remove_dir(path: str) -> bool:
    """Remove an empty directory (never a link); False when it is not empty."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    fault_point("rmdir", path)
    try:
        os.rmdir(path)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    fsync_dir(os.path.dirname(path))
    return True


def _kind(mode: int) -> str:
    """What a file that is no regular file is, in a person's words."""
    kinds = {
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
    }
    return kinds.get(stat.S_IFMT(mode), "not a regular file")


def regular_or_absent(root: HostRoot, rel: str) -> os.stat_result | None:
    """``rel`` (resolved inside the root) as a regular file within :data:`MAX_FILE`, or None
    when absent or a directory. Anything else is refused (exit 2) from its ``lstat`` alone,
    never opened: a FIFO would block the reader (holding the lock), a device read forever,
    and a 3 GiB file be loaded whole. The path is the journal's, so as hostile as the root."""
    try:
        st = os.lstat(root.real(rel))
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        raise MalformedHostData(
            echo_path(root.abs(rel)), f"{_kind(st.st_mode)}, not a regular file: refused"
        )
    if st.st_size > MAX_FILE:
        raise _too_large(root, rel)
    return st


def _too_large(root: HostRoot, rel: str) -> MalformedHostData:
    return MalformedHostData(
        echo_path(root.abs(rel)),
        f"larger than {MAX_FILE >> 20} MiB, the most passthrough reads of one file: refused",
    )


def read_file(root: HostRoot, rel: str) -> bytes | None:
    """A file's bytes, None when absent (or a directory). Only a regular file of at most
    :data:`MAX_FILE` is read, and never more than one byte past it (a file that grows
    between the check and the read is refused too): see :func:`regular_or_absent`."""
    if regular_or_absent(root, rel) is None:
        return None
    try:
        fd = os.open(root.real(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None  # gone since the lstat
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MalformedHostData(echo_path(root.abs(rel)), "not a regular file: refused")
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_FILE and (chunk := os.read(fd, min(1 << 20, MAX_FILE + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_FILE:
            raise _too_large(root, rel)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_own(path: str, limit: int | None = None) -> bytes | None:
    """One of our own files (journal, backup): a link is never followed (None, as for a
    file that is absent or not regular). ``limit``: more than that raises EFBIG."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if limit is not None and total > limit:
                raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB", path)
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
