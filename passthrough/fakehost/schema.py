# SPDX-License-Identifier: Apache-2.0
"""The shape of a host description: every key known, every value of its type.

A mistyped key used to be ignored silently (the host then quietly got the default);
:func:`check` turns it into a :class:`BadDescription` naming the file, the key's path
and the nearest known key.
"""

from __future__ import annotations

import difflib
from dataclasses import field
from typing import Any

from passthrough.errors import BadDescription
from passthrough.records import frozen

NONE = type(None)
Types = tuple[type, ...]


@frozen
class Keys:
    """A mapping whose keys are all known; ``required`` ones must be there."""

    fields: dict[str, Shape]
    required: tuple[str, ...] = ()


@frozen
class ListOf:
    item: Shape


@frozen
class MapOf:
    """A mapping whose keys the author chooses (config names, BAR numbers, vendor ids)."""

    key: Types
    value: Types


@frozen
class OneOf:
    """A string among a few words."""

    choices: tuple[str, ...]


@frozen
class Anything:
    """Free-form: YAML anchors the author reuses elsewhere in the file."""

    note: str = field(default="")


Shape = Types | Keys | ListOf | MapOf | OneOf | Anything

_WORDS = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping"}
_WORDS[list] = "a list"
_WORDS[NONE] = "null"


def _is(value: Any, types: Types) -> bool:
    # YAML's true is an int to Python: a count given as "yes" is a mistake, not 1
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _expected(types: Types) -> str:
    return " or ".join(_WORDS.get(t, t.__name__) for t in types)


def _got(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({type(value).__name__})"


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, why: str) -> BadDescription:
        return BadDescription(self.source, f"{path}: {why}" if path else why)

    def check(self, value: Any, shape: Shape, path: str) -> None:
        if isinstance(shape, Keys):
            self.keys(value, shape, path)
        elif isinstance(shape, ListOf):
            if not isinstance(value, list):
                raise self.fail(path, f"expected a list, got {_got(value)}")
            for i, item in enumerate(value):
                self.check(item, shape.item, f"{path}[{i}]{_addr(item)}")
        elif isinstance(shape, MapOf):
            if not isinstance(value, dict):
                raise self.fail(path, f"expected a mapping, got {_got(value)}")
            for key, item in value.items():
                if not _is(key, shape.key):
                    raise self.fail(path, f"key {_got(key)}: expected {_expected(shape.key)}")
                self.scalar(item, shape.value, _join(path, key))
        elif isinstance(shape, OneOf):
            if not isinstance(value, str) or value not in shape.choices:
                raise self.fail(
                    path, f"expected one of {', '.join(shape.choices)}; got {_got(value)}"
                )
        elif isinstance(shape, tuple):
            self.scalar(value, shape, path)

    def scalar(self, value: Any, types: Types, path: str) -> None:
        if not _is(value, types):
            quote = "; quote it" if str in types and isinstance(value, int | float) else ""
            raise self.fail(path, f"expected {_expected(types)}, got {_got(value)}{quote}")

    def keys(self, value: Any, shape: Keys, path: str) -> None:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {_got(value)}")
        for key, item in value.items():
            known = shape.fields.get(key) if isinstance(key, str) else None
            if known is None:
                near = difflib.get_close_matches(str(key), list(shape.fields), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise self.fail(path, f"unknown key {key!r}{hint}")
            self.check(item, known, _join(path, key))
        for key in shape.required:
            if key not in value:
                raise self.fail(path, f"missing key {key!r}")


def _addr(item: Any) -> str:
    """A PCI entry's address beside its index, so the author finds it in the file."""
    if isinstance(item, dict) and isinstance(item.get("addr"), str):
        return f" ({item['addr']})"
    return ""


def check(value: Any, shape: Shape, source: str) -> None:
    """Raise :class:`BadDescription` at the first key or value ``shape`` does not allow."""
    _Checker(source).check(value, shape, "")
