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

from passthrough.errors import MalformedHostData, NotAHostRoot

MAX_LINK_HOPS = 40  # the kernel's own limit (ELOOP)


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
        # ``todo`` holds the components still to walk, last first; ``here`` is the
        # resolved prefix, which never holds a link (a final one aside).
        todo = [p for p in reversed(rel.split("/")) if p and p != "."]
        here = ""
        complete = True
        hops = 0
        base = self.path if self.path != "/" else ""
        while todo:
            part = todo.pop()
            if part == "..":
                here = here.rpartition("/")[0]  # at the root, stays at the root
                continue
            candidate = f"{here}/{part}" if here else part
            if todo and candidate in self._plain_dirs:
                here = candidate
                continue
            full = f"{base}/{candidate}"
            if not todo and not follow_final:
                complete = complete and os.path.lexists(full)
                here = candidate
                break
            try:
                target = os.readlink(full)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    complete = False
                elif exc.errno == errno.EINVAL and todo:
                    self._plain_dirs.add(candidate)
                # EINVAL: not a link; anything else: the open that follows reports it
                here = candidate
                continue
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), self._join(rel))
            self._saw_link(candidate, target)
            if target.startswith("/"):
                here = ""
            todo.extend(p for p in reversed(target.split("/")) if p and p != ".")
        return here, complete

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
            return os.path.isdir(self.real(rel))
        except OSError:
            return False

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
    def read_bytes(self, rel: str, limit: int = 1 << 24) -> bytes | None:
        try:
            fd = os.open(self.real(rel), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError:
            self.problems.append(f"{rel}: permission denied")
            return None
        except OSError as exc:
            self.problems.append(f"{rel}: {exc.strerror}")
            return None
        try:
            first = os.read(fd, 1 << 16)  # sysfs attributes fit in one page
            if len(first) < 1 << 16:
                return first
            chunks = [first]
            total = len(first)
            while total < limit:
                chunk = os.read(fd, min(1 << 20, limit - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
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
            return os.readlink(self.real(rel, follow_final=False))
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
