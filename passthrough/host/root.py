# SPDX-License-Identifier: Apache-2.0
"""Reading a host root: the live ``/``, an unpacked snapshot, or a test fixture.

Every reader and writer of the host goes through :class:`HostRoot`, so nothing below
the CLI touches ``/`` directly and all three kinds of root take the same code path.

Containment: a path under the root is resolved the way a chroot resolves it, one
component at a time. A link's absolute target starts again at the root, and ``..``
never climbs above it, so neither a snapshot nor a mounted disk image can make us read
the reading machine's own files or write outside the tree. On the live root ``/`` that
is exactly what the kernel does, so no walking is needed there.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import posixpath
import stat

from passthrough.errors import MalformedHostData, NotAHostRoot
from passthrough.guest.contain import MAX_LINK_HOPS, parts, resolve

__all__ = ["MAX_LINK_HOPS", "HostRoot"]
# The largest file read from a root (docs/limits.md): config files are a few KiB, the
# biggest read (pci.ids, modules.alias) a few MiB.
MAX_FILE = 16 << 20


class HostRoot:
    # True: walk the live root too (the snapshot recorder must see every link followed).
    walk_live = False

    def __init__(self, path: str) -> None:
        if not os.path.exists(path):
            raise NotAHostRoot(path, "no such directory")
        if not os.path.isdir(path):
            raise NotAHostRoot(path, "not a directory")
        self.path = os.path.abspath(path)
        self.is_live = self.path == "/"
        self.problems: list[str] = []
        # Parents already seen to be real directories, not links: a scan reads thousands of
        # files under the same few directories. Only "not a link" is remembered, never a
        # link or an absence, and no command here turns a directory into a link.
        self._plain_dirs: set[str] = set()
        # Directories as named (``sys/bus/pci/devices/0000:01:00.0``) -> (resolved inside the
        # root, links followed to get there): every attribute of a device is read through the
        # same directory, so its links are walked once. Only a complete resolution is kept.
        self._dirs: dict[str, tuple[str, int]] = {}

    # -- containment -------------------------------------------------------
    def _saw_link(self, rel: str, target: str) -> None:
        """Called for every link followed while resolving (the recorder keeps them)."""

    def _walk(self, rel: str, follow_final: bool, spell_out: bool = False) -> tuple[str, bool]:
        """``rel`` resolved inside the root: (path relative to the root with no link in
        it, except a final one when ``follow_final`` is false; whether every component
        existed). Raises ELOOP past :data:`MAX_LINK_HOPS` links. On the live root the
        kernel's own resolution is the same, so the walk is skipped unless the caller
        needs the resolved path itself (``spell_out``)."""
        if self.is_live and not self.walk_live and not spell_out:
            return rel.lstrip("/"), True  # the kernel resolves it as it would in a chroot
        parent, _, name = rel.strip("/").rpartition("/")
        if parent and name not in (".", ".."):
            known = self._dir(parent, rel)
            if known is not None:  # the parent once, then only the last component
                return self._resolve(known[0], [name], follow_final, known[1], rel)[:2]
        return self._resolve("", parts(rel), follow_final, 0, rel)[:2]

    def _dir(self, parent: str, rel: str) -> tuple[str, int] | None:
        """``parent`` resolved as a directory and the links followed to reach it (they count
        towards the limit of the whole path), or None when some component is missing."""
        known = self._dirs.get(parent)
        if known is None:
            # from the directory above, itself resolved once: a new directory costs one step
            up, _, name = parent.rpartition("/")
            start = self._dir(up, rel) if up and name not in ("", ".", "..") else ("", 0)
            if start is None:
                return None
            todo = [name] if up and name not in ("", ".", "..") else parts(parent)
            here, complete, hops = self._resolve(start[0], todo, True, start[1], rel, as_dir=True)
            if not complete:
                return None
            known = self._dirs[parent] = (here, hops)
        return known

    def _resolve(
        self,
        here: str,
        todo: list[str],
        follow_final: bool,
        hops: int,
        rel: str,
        as_dir: bool = False,
    ) -> tuple[str, bool, int]:
        """Walk ``todo`` (last first) from ``here``, a resolved prefix that holds no link,
        ``hops`` links followed before: (resolved, complete, links followed in all). The one
        containment walk (:func:`passthrough.guest.contain.resolve`), with this root's cache
        of plain directories and its link observer."""
        return resolve(
            self.path if self.path != "/" else "",
            todo,
            follow_final,
            name=self._join(rel),
            here=here,
            hops=hops,
            plain_dirs=self._plain_dirs,
            saw_link=self._saw_link,
            as_dir=as_dir,
        )

    def _join(self, contained: str) -> str:
        return self.path + "/" + contained if self.path != "/" else "/" + contained

    def contained(self, rel: str, follow_final: bool = True) -> str:
        """``rel`` resolved inside the root, relative to it (no leading /)."""
        return self._walk(rel, follow_final)[0]

    def real(self, rel: str, follow_final: bool = True) -> str:
        """The absolute path to open for ``rel``: every link in it resolved inside the
        root, the final one too unless ``follow_final`` is false (to remove or read a
        link itself). Readers and writers alike use this, never a joined string."""
        return self._join(self._walk(rel, follow_final)[0])

    def _open(self, rel: str) -> int:
        """``os.open`` of ``rel`` for reading, resolved as :meth:`real` resolves it. When the
        parent is known, the file is opened with O_NOFOLLOW instead of asking first whether
        it is a link: only a link fails that way (ELOOP), and it takes the walk. Non-blocking:
        a FIFO planted in a root reads as empty instead of hanging the reader (no effect on
        regular files, sysfs or /proc)."""
        known = self._known(rel)
        if known is not None:
            try:
                return os.open(known, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
        return os.open(self.real(rel), os.O_RDONLY | os.O_NONBLOCK)

    def _known(self, rel: str) -> str | None:
        """The absolute path of ``rel`` with its parent resolved and its last component not
        followed; None where that does not apply: a parent that is missing, a last component
        of ``..``, the live root (not walked)."""
        if self.is_live and not self.walk_live:
            return None
        parent, _, name = rel.strip("/").rpartition("/")
        known = self._dir(parent, rel) if parent and name not in (".", "..") else None
        return None if known is None else self._join(f"{known[0]}/{name}")

    def open_dir(self, rel: str) -> int | None:
        """A descriptor of the directory ``rel``, resolved inside the root as :meth:`real`
        resolves it, for a reader that takes many files of one directory at once (the
        caller closes it); None where that does not apply: a directory that is missing or
        not one, or a root whose subclass watches every read (the snapshot recorder), which
        is read file by file as before."""
        cls = type(self)
        if not (
            cls.read_bytes is HostRoot.read_bytes
            and cls.readlink is HostRoot.readlink
            and cls._saw_link is HostRoot._saw_link
        ):
            return None
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            if self.is_live and not self.walk_live:
                return os.open("/" + rel.strip("/"), flags)
            # the parent resolved; the last component opened without following it (the
            # kernel's ELOOP is the check that it is no link), else resolved too
            known = self._known(rel)
            if known is not None:
                try:
                    return os.open(known, flags)
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        return None
            resolved = self._dir(rel.strip("/"), rel)
            if resolved is None:
                return None
            return os.open(self._join(resolved[0]), flags)  # every link in it followed
        except OSError:  # ELOOP past the limit, a permission: the file-by-file path says
            return None

    def abs(self, rel: str) -> str:
        """How ``rel`` is named in messages (joined, not resolved: never opened)."""
        rel = rel.lstrip("/")
        return self._join(rel)

    def glob(self, pattern: str) -> list[str]:
        """Regular files matching ``pattern`` (wildcards in the last component only),
        as paths relative to the root."""
        parent, _, name = pattern.strip("/").rpartition("/")
        found: list[str] = []
        for entry in self.listdir(parent):
            rel = f"{parent}/{entry}" if parent else entry
            if fnmatch.fnmatchcase(entry, name) and self.isfile(rel):
                found.append(rel)
        return found

    def isfile(self, rel: str) -> bool:
        try:
            return os.path.isfile(self.real(rel))
        except OSError:
            return False

    def exists(self, rel: str) -> bool:
        try:
            return os.path.lexists(self.real(rel, follow_final=False))
        except OSError:
            return False

    def isdir(self, rel: str) -> bool:
        try:
            if self._plain_dir(rel):
                return True
            return os.path.isdir(self.real(rel))
        except OSError:
            return False

    def _plain_dir(self, rel: str) -> bool:
        """Whether ``rel`` is a directory and no link, its parent resolved (one lstat, not a
        readlink and a stat); remembered as resolved, as :meth:`_dir` would."""
        if self.is_live and not self.walk_live:
            return False
        path = rel.strip("/")
        parent, _, name = path.rpartition("/")
        known = self._dir(parent, rel) if parent and name not in (".", "..") else None
        if known is None:
            return False
        here = f"{known[0]}/{name}" if known[0] else name
        if not stat.S_ISDIR(os.lstat(self._join(here)).st_mode):
            return False
        self._dirs.setdefault(path, (here, known[1]))
        self._plain_dirs.add(here)
        return True

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.real(rel)))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return []
        except PermissionError:
            self.problems.append(f"{rel}: permission denied")
            return []
        except OSError as exc:
            self.problems.append(f"{rel}: {exc.strerror}")
            return []

    # -- contents ----------------------------------------------------------
    def read_bytes(self, rel: str, limit: int = MAX_FILE) -> bytes | None:
        """The file's bytes; None when absent or unreadable (noted in ``problems``). A file
        longer than ``limit`` is refused (:class:`MalformedHostData`, exit 2), never cut:
        a plan built on part of a config file would write the rest away."""
        try:
            fd = self._open(rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError:
            self.problems.append(f"{rel}: permission denied")
            return None
        except OSError as exc:
            self.problems.append(f"{rel}: {exc.strerror}")
            return None
        try:
            if stat.S_ISCHR(mode := os.fstat(fd).st_mode) or stat.S_ISBLK(mode):
                # no reader wants a device's stream (/dev/zero never ends): as unreadable
                self.problems.append(f"{rel}: a device, not a file")
                return None
            first = os.read(fd, 1 << 16)  # sysfs attributes fit in one page
            if len(first) < 1 << 16:
                return first
            chunks = [first]
            total = len(first)
            while total <= limit:  # one byte past the limit tells "too large" from "fits"
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > limit:
                raise MalformedHostData(
                    self.abs(rel),
                    f"larger than {limit >> 20} MiB, the most passthrough reads of one file: "
                    "refused rather than read in part",
                )
            return b"".join(chunks)
        except OSError as exc:
            # Some sysfs attributes refuse reads (EIO, EINVAL) on some devices.
            self.problems.append(f"{rel}: {exc.strerror}")
            return None
        finally:
            os.close(fd)

    def read(self, rel: str) -> str | None:
        """The file's text with surrounding whitespace removed, or None when absent."""
        data = self.read_bytes(rel)
        if data is None:
            return None
        return data.decode("utf-8", "replace").strip()

    def read_int(self, rel: str, base: int = 10) -> int | None:
        text = self.read(rel)
        if text is None or text == "":
            return None
        try:
            return int(text, base)
        except ValueError:
            kind = "a hex number" if base == 16 else "a number"
            raise MalformedHostData(self.abs(rel), f"expected {kind}, got {text[:40]!r}") from None

    def readlink(self, rel: str) -> str | None:
        try:
            return os.readlink(self._known(rel) or self.real(rel, follow_final=False))
        except OSError:
            return None

    def link_name(self, rel: str) -> str | None:
        """Last component of a link's target (driver, iommu_group, ...)."""
        target = self.readlink(rel)
        if target is None:
            return None
        return posixpath.basename(target.rstrip("/"))

    def resolve(self, rel: str) -> str | None:
        """The real path of ``rel`` relative to the root, links followed inside it;
        None when some component does not exist."""
        try:
            contained, complete = self._walk(rel, follow_final=True, spell_out=True)
        except OSError:
            return None
        return contained if complete else None
