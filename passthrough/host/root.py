"""Reading a host root: the live ``/``, an unpacked snapshot, or a test fixture.

Every reader of the host goes through :class:`HostRoot`, so nothing below the CLI
touches ``/`` directly and all three kinds of root take the same code path.
Reads never write, and never follow a link out of the root.
"""

from __future__ import annotations

import os
import posixpath

from passthrough.errors import MalformedHostData, NotAHostRoot


class HostRoot:
    def __init__(self, path: str) -> None:
        if not os.path.exists(path):
            raise NotAHostRoot(path, "no such directory")
        if not os.path.isdir(path):
            raise NotAHostRoot(path, "not a directory")
        self.path = os.path.abspath(path)
        self.is_live = self.path == "/"
        self.problems: list[str] = []

    # -- paths -------------------------------------------------------------
    def abs(self, rel: str) -> str:
        """Absolute path of ``rel`` (a path inside the root, with or without a leading /)."""
        rel = rel.lstrip("/")
        return self.path + "/" + rel if self.path != "/" else "/" + rel

    def rel(self, absolute: str) -> str:
        if self.path == "/":
            return absolute.lstrip("/")
        return absolute[len(self.path) :].lstrip("/")

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.abs(rel))

    def isdir(self, rel: str) -> bool:
        return os.path.isdir(self.abs(rel))

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.abs(rel)))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return []
        except PermissionError:
            self.problems.append(f"{rel}: permission denied")
            return []

    # -- contents ----------------------------------------------------------
    def read_bytes(self, rel: str, limit: int = 1 << 24) -> bytes | None:
        try:
            fd = os.open(self.abs(rel), os.O_RDONLY)
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
            return os.readlink(self.abs(rel))
        except OSError:
            return None

    def link_name(self, rel: str) -> str | None:
        """Last component of a link's target (driver, iommu_group, ...)."""
        target = self.readlink(rel)
        if target is None:
            return None
        return posixpath.basename(target.rstrip("/"))

    def resolve(self, rel: str, depth: int = 0) -> str | None:
        """Follow links inside the root; return the real path relative to the root.

        Absolute link targets are taken relative to the root (as in a chroot), so a
        snapshot or fixture never resolves into the machine that reads it.
        """
        parts = [p for p in rel.strip("/").split("/") if p]
        resolved: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/".join([*resolved, part])
            target = self.readlink(candidate)
            if target is None:
                if not self.exists(candidate):
                    return None
                resolved.append(part)
                continue
            hops += 1
            if hops > 40:
                return None
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p] + parts
        return "/".join(resolved)
