# SPDX-License-Identifier: Apache-2.0
"""Reading the journal's JSON strictly: every field has the type it must have, or the whole
journal is refused before anything is done with it.

The journal is a file under the root, and the root may be someone else's image: a value
of the wrong type (a string where a mode belongs), a number out of range (``1e400``), a
NUL in a path or nesting a thousand deep must end as one :class:`ValueError` here, never
as an error half-way through an undo.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from passthrough.actions import Binding, PlanRecord
from passthrough.inputs import shown_key
from passthrough.model import BootloaderKind

_SHA256 = re.compile(r"[0-9a-f]{64}")
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_MISSING: Any = object()


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a journal holds")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


class Twice(ValueError):
    """A key given twice in one JSON object."""


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose every key is given once: a key given twice (json keeps the later
    silently) is refused, as kubectl refuses it."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise Twice(f"key {shown_key(key)} given twice in one object")
        out[key] = value
    return out


_SPACE = re.compile(r"[ \t\n\r]*")


class _Found(Exception):
    """The first key given twice, where (raised out of :func:`_twice_at`'s walk)."""


def _twice_at(text: str) -> str | None:
    """Where the first key given twice in ``text`` is, as ``line L, column C: key K given
    twice (first at line L2, column C2)``; None where the walk cannot tell (text that is not
    JSON past that point). The json module's hook sees an object's pairs without their
    places, so this second, rare walk finds them; values other than objects and arrays are
    stepped over by the json module's own decoder."""
    scalar = json.JSONDecoder(parse_constant=_bad_constant, parse_float=_finite)

    def at(i: int) -> str:
        line = text.count("\n", 0, i) + 1
        return f"line {line}, column {i - text.rfind(chr(10), 0, i)}"

    def skip(i: int) -> int:
        match = _SPACE.match(text, i)
        return match.end() if match else i

    def value(i: int) -> int:
        i = skip(i)
        if text.startswith("{", i):
            seen: dict[str, int] = {}  # each key's offset (its line is counted once, if twice)
            i = skip(i + 1)
            while not text.startswith("}", i):
                key, end = scalar.raw_decode(text, i)
                if not isinstance(key, str):
                    raise ValueError("no key here")  # not JSON: the walk cannot tell
                if key in seen:
                    raise _Found(
                        f"{at(i)}: key {shown_key(key)} given twice (first at {at(seen[key])})"
                    )
                seen[key] = i
                i = skip(value(skip(end) + 1))  # past the ':' and the value
                i = skip(i + 1) if text.startswith(",", i) else i
            return i + 1
        if text.startswith("[", i):
            i = skip(i + 1)
            while not text.startswith("]", i):
                i = skip(value(i))
                i = skip(i + 1) if text.startswith(",", i) else i
            return i + 1
        return int(scalar.raw_decode(text, i)[1])

    try:
        value(0)
    except _Found as found:
        return str(found)
    except (ValueError, IndexError, RecursionError):
        return None
    return None


def loads(raw: bytes) -> Any:
    """Our JSON state files: no NaN or Infinity, finite numbers, no key twice (named with its
    line and column); a number of more digits than Python converts is a ValueError too."""
    try:
        return json.loads(
            raw, parse_constant=_bad_constant, parse_float=_finite, object_pairs_hook=_once
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except Twice as exc:
        where = _twice_at(raw.decode("utf-8", "replace"))
        raise Twice(where or str(exc)) from None


def inside(rel: str) -> str:
    """A path from the journal, which undo will write: relative and never climbing out
    (a journal is a file under the root, and the root may be someone else's image)."""
    if not rel or rel.startswith("/") or ".." in rel.split("/"):
        raise ValueError(f"path {rel[:80]!r} is not inside the root")
    return rel


class Fields:
    """One JSON object of the journal, read field by field with the type each must have."""

    def __init__(self, d: object, what: str) -> None:
        if not isinstance(d, dict):
            raise ValueError(f"{what} is not an object")
        self.d: dict[str, Any] = d
        self.what = what

    def _get(self, key: str, default: Any) -> Any:
        if key in self.d:
            return self.d[key]
        if default is _MISSING:
            raise ValueError(f"{self.what} has no {key!r}")
        return default

    def _wrong(self, key: str, kind: str) -> ValueError:
        return ValueError(f"{self.what}: {key!r} is not {kind}")

    def text(self, key: str, default: Any = _MISSING) -> str:
        v = self._get(key, default)
        if not isinstance(v, str) or "\0" in v:
            raise self._wrong(key, "a string")
        return v

    def opt_text(self, key: str) -> str | None:
        return None if self.d.get(key) is None else self.text(key)

    def integer(self, key: str, lo: int = 0, hi: int = 1 << 32, default: Any = _MISSING) -> int:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self._wrong(key, f"a whole number from {lo} to {hi}")
        return v

    def opt_integer(self, key: str, hi: int = 1 << 32) -> int | None:
        return None if self.d.get(key) is None else self.integer(key, hi=hi)

    def number(self, key: str, default: Any = _MISSING) -> float:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e11:
            raise self._wrong(key, "a time")
        return float(v)

    def opt_number(self, key: str) -> float | None:
        return None if self.d.get(key) is None else self.number(key)

    def flag(self, key: str) -> bool:
        v = self._get(key, False)
        if not isinstance(v, bool):
            raise self._wrong(key, "true or false")
        return v

    def texts(self, key: str) -> list[str]:
        v = self._get(key, None)
        if v is None:
            return []
        if not isinstance(v, list) or not all(isinstance(s, str) and "\0" not in s for s in v):
            raise self._wrong(key, "a list of strings")
        return list(v)

    def opt_texts(self, key: str) -> list[str] | None:
        return None if self.d.get(key) is None else self.texts(key)

    def sha(self, key: str) -> str | None:
        v = self.opt_text(key)
        if v is not None and not _SHA256.fullmatch(v):
            raise self._wrong(key, "a sha256")
        return v

    def path(self, key: str) -> str | None:
        v = self.opt_text(key)
        return None if v is None else inside(v)

    def paths(self, key: str) -> list[str]:
        return [inside(p) for p in self.texts(key)]

    def ident(self, key: str) -> str:
        v = self.text(key)
        if not _ID.fullmatch(v):
            raise self._wrong(key, "a transaction id")
        return v

    def objects(self, key: str) -> list[Fields]:
        v = self._get(key, None)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self._wrong(key, "a list")
        return [Fields(item, f"{self.what}: {key}[{i}]") for i, item in enumerate(v)]

    def obj(self, key: str) -> Fields:
        return Fields(self._get(key, None) or {}, f"{self.what}: {key}")


def record(f: Fields) -> PlanRecord:
    """A plan record (see :class:`PlanRecord`), its every field checked first."""
    for card in f.objects("cards"):
        card.text("address")
        card.text("name", "")
        card.texts("functions")
    f.texts("functions")
    args = f.obj("kernel_args")
    args.texts("set")
    args.texts("remove")
    Binding(f.text("binding", Binding.IDS.value))
    BootloaderKind(f.text("bootloader", BootloaderKind.UNKNOWN.value))
    drivers = f.obj("vfio_drivers")
    for address in drivers.d:
        drivers.text(address)
    return PlanRecord.from_json(f.d)
