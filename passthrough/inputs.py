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


class Unreadable(Exception):
    """Why the file cannot be used; the caller names the flag in its own error."""


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


def read_bytes(path: str, what: str, limit: int = MAX_INPUT) -> bytes:
    """The file's bytes, at most ``limit`` of them (larger is refused, never cut); a FIFO
    or a device is refused without waiting on it or reading it."""
    try:
        # non-blocking: a FIFO given as the file must not hang us before we see what it is
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Unreadable(exc.strerror or "cannot read it") from None
    # decided on the descriptor before any file object: fdopen of a directory raises
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable(NOT_REGULAR)
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)  # one byte more tells "too large" from "just fits"
        except OSError as exc:
            raise Unreadable(exc.strerror or "cannot read it") from None
    if len(data) > limit:
        raise Unreadable(f"larger than {limit >> 20} MiB: not {what}")
    return data


@functools.cache
def depth_bounded() -> type:
    """A ``yaml.SafeLoader`` that refuses a document nested deeper than :data:`MAX_DEPTH`
    (:class:`Unreadable` naming the line) before composing the level past it. Its
    ``what`` ("a VM spec file") completes the message."""
    import yaml

    class Loader(yaml.SafeLoader):
        what = "a YAML file"
        depth = 0

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
