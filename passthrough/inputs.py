# SPDX-License-Identifier: Apache-2.0
"""Small text files a user names on the command line (a VM spec, an SSH key file):
read whole but bounded, as UTF-8, with the reason in words when that fails."""

from __future__ import annotations

from typing import Any

MAX_INPUT = 1 << 20


class Unreadable(Exception):
    """Why the file cannot be used; the caller names the flag in its own error."""


def read_text(path: str, what: str, limit: int = MAX_INPUT) -> str:
    """The file's text; ``what`` ("a VM spec file") completes the too-large message."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)  # one byte more tells "too large" from "just fits"
    except OSError as exc:
        raise Unreadable(exc.strerror or "cannot read it") from None
    if len(data) > limit:
        raise Unreadable(f"larger than {limit >> 20} MiB: not {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise Unreadable(f"line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 text") from None


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

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if max_nodes is None and self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise Unreadable(
                    f"line {mark.line + 1}: YAML aliases (*name) are not accepted in {what}"
                )
            return super().compose_node(parent, index)

        def construct_document(self, node: Any) -> Any:
            if max_nodes is not None and expanded(node, {}, set()) > max_nodes:
                raise Unreadable(f"its YAML aliases expand past {max_nodes} nodes: not {what}")
            return super().construct_document(node)

    return Loader
