# SPDX-License-Identifier: Apache-2.0
"""Manifests in and out: a YAML stream with a comment header; files read with a bound."""

from __future__ import annotations

from typing import Any

import yaml

from passthrough.errors import PassthroughError, echo_path

MAX_BYTES = 8 << 20  # a manifest file larger than this is not one we wrote or could check
MAX_DOCUMENTS = 1000


class BadManifest(PassthroughError):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{echo_path(path)}: {why}")


def dump_stream(documents: list[dict[str, Any]], header: list[str]) -> str:
    head = "".join(f"# {line}\n" for line in header)
    body = yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True, width=100)
    return head + body


def load_stream(path: str) -> list[dict[str, Any]]:
    """The stream's Kubernetes objects. Read whole but bounded (:data:`MAX_BYTES`), then parsed
    one document at a time: the 1,001st document, empty ones included, is refused before it
    is parsed (a stream of millions of tiny documents costs no more than 1,000)."""
    from passthrough.inputs import Unreadable, read_bytes, yaml_without_aliases

    loader = yaml_without_aliases("a manifest")
    docs: list[dict[str, Any]] = []
    try:
        text = read_bytes(path, "a manifest", MAX_BYTES).decode("utf-8")
        for seen, d in enumerate(yaml.load_all(text, Loader=loader), start=1):
            if seen > MAX_DOCUMENTS:
                raise BadManifest(path, f"more than {MAX_DOCUMENTS} documents")
            if d is not None:
                docs.append(d)
    except Unreadable as exc:
        raise BadManifest(path, str(exc)) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f"line {where.line + 1}: " if where is not None else ""
        raise BadManifest(path, f"{line}not YAML ({type(exc).__name__})") from exc
    for i, d in enumerate(docs, start=1):
        if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
            raise BadManifest(path, f"document {i} is not a Kubernetes object (no kind)")
    return docs
