# SPDX-License-Identifier: Apache-2.0
"""Small text files a user names on the command line (a VM spec, an SSH key file):
read whole but bounded, as UTF-8, with the reason in words when that fails."""

from __future__ import annotations

import functools
import os
import stat
from typing import Any

MAX_INPUT = 1 << 20
# How deep a YAML document may nest (docs/limits.md): a Kubernetes object nests about 15
# levels, a spec or host description fewer. PyYAML composes a document recursively, so
# 1,000 nested ``[`` would otherwise end in a RecursionError traceback.
MAX_DEPTH = 100


# The longest integer a YAML input may spell (docs/limits.md): every number we read fits in
# 64 bits (20 digits); Python refuses to turn more than 4,300 decimal digits into an int (a
# ValueError deep in the loader), and a huge hex one would fail later, when printed.
MAX_INT_TEXT = 100


class Unreadable(Exception):
    """Why the file cannot be used; the caller names the flag in its own error. ``errno``:
    the system's error number where opening it failed (ENOENT: absent)."""

    def __init__(self, why: str, errno: int | None = None) -> None:
        super().__init__(why)
        self.errno = errno


# What virsh reads of a domain file at most (tools/virsh.h VSH_MAX_XML_FILE, 10 MiB): a
# domain of 10,000 hostdevs is about 2.5 MiB
MAX_DOMAIN = 10 << 20
NOT_REGULAR = "not a regular file"  # a FIFO, a device, a directory: refused, never waited on


def read_text(path: str, what: str, limit: int = MAX_INPUT) -> str:
    """The file's text; ``what`` ("a VM spec file") completes the too-large message."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise Unreadable(f"line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 text") from None


def open_regular(path: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file: a FIFO, a device, a
    socket or a directory is :class:`Unreadable` (:data:`NOT_REGULAR`) without waiting on it
    (opened non-blocking: opening a FIFO would otherwise wait for a writer forever). Every
    reader of a file a user or a root hands us opens it here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # a socket: ENXIO
        raise Unreadable(exc.strerror or "cannot read it", exc.errno) from None
    # decided on the descriptor, not on the name: what was opened is what is read
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable(NOT_REGULAR)
    return fd


def read_head(path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of an optional file (a marker, a version file); None where it
    is absent, unreadable or not a regular file."""
    try:
        fd = open_regular(path)
    except Unreadable:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            return fh.read(limit)
        except OSError:
            return None


def read_bytes(path: str, what: str, limit: int = MAX_INPUT) -> bytes:
    """The file's bytes, at most ``limit`` of them (larger is refused, never cut); a FIFO
    or a device is refused without waiting on it or reading it."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)  # one byte more tells "too large" from "just fits"
        except OSError as exc:
            raise Unreadable(exc.strerror or "cannot read it") from None
    if len(data) > limit:
        raise Unreadable(f"larger than {limit >> 20} MiB: not {what}")
    return data


def shown_key(key: object) -> str:
    """A key named in a message: its repr, cut to 60 characters."""
    shown = repr(key)
    return shown if len(shown) <= 60 else shown[:57] + "..."


@functools.cache
def depth_bounded() -> type:
    """A ``yaml.SafeLoader`` that refuses a document nested deeper than :data:`MAX_DEPTH`
    (:class:`Unreadable` naming the line) before composing the level past it. Its
    ``what`` ("a VM spec file") completes the message."""
    import yaml

    class Loader(yaml.SafeLoader):
        what = "a YAML file"
        depth = 0

        def bounded_int(self, node: Any) -> Any:
            if len(node.value) > MAX_INT_TEXT:
                raise Unreadable(
                    f"line {node.start_mark.line + 1}: an integer {len(node.value)} characters "
                    f"long (at most {MAX_INT_TEXT}): not {self.what}"
                )
            return yaml.SafeLoader.construct_yaml_int(self, node)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            # a key given twice: YAML keeps the later silently, kubectl and the API server
            # refuse it (keys a merge ``<<`` brings are overridden, as YAML means them to be)
            seen: dict[Any, int] = {}
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                    seen.setdefault(key, line)
                except TypeError:
                    continue  # unhashable: the constructor's own error names it
                if first is not None:
                    raise Unreadable(
                        f"line {line}: key {shown_key(key)} given twice (first on line "
                        f"{first}): not {self.what}"
                    )
            return super().construct_mapping(node, deep)

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.depth >= MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise Unreadable(
                    f"line {mark.line + 1}: nested deeper than {MAX_DEPTH} levels: not {self.what}"
                )
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.bounded_int)
    return Loader


def yaml_without_aliases(what: str, max_nodes: int | None = None) -> type:
    """A ``yaml.SafeLoader`` bounded against alias bombs: a few hundred bytes of nested
    aliases (``*name``, ``<<: *name``) expand to gigabytes. With ``max_nodes`` None, aliases
    are refused outright; otherwise they are allowed while the document, every alias
    expanded, has at most ``max_nodes`` nodes (a bundled host description shares its PCI
    entries that way). A refusal is :class:`Unreadable` naming the line and ``what``."""
    import yaml

    def expanded(node: Any, memo: dict[int, int], open_: set[int]) -> int:
        if id(node) in memo:
            return memo[id(node)]
        if id(node) in open_:
            raise Unreadable(f"line {node.start_mark.line + 1}: a YAML alias refers to itself")
        open_.add(id(node))
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(expanded(c, memo, open_) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(expanded(k, memo, open_) + expanded(v, memo, open_) for k, v in node.value)
        open_.discard(id(node))
        memo[id(node)] = size
        return size

    class Loader(depth_bounded()):  # type: ignore[misc]
        def compose_node(self, parent: Any, index: Any) -> Any:
            if max_nodes is None and self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise Unreadable(
                    f"line {mark.line + 1}: YAML aliases (*name) are not accepted in {what}"
                )
            return super().compose_node(parent, index)

        def construct_document(self, node: Any) -> Any:
            if max_nodes is not None and expanded(node, {}, set()) > max_nodes:
                raise Unreadable(f"its YAML aliases expand past {max_nodes} nodes: not {what}")
            return super().construct_document(node)

    Loader.what = what
    return Loader
