# SPDX-License-Identifier: Apache-2.0
"""Frozen records: ``@frozen`` is ``@dataclass(frozen=True)`` for less at import time.

``dataclass(frozen=True)`` writes and compiles six methods for each class when its module is
imported (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``,
``__delattr__``): about 2 ms a class on a loaded machine, most of what a command paid to import
the model and the planner, and paid again by every host of a fleet run (docs/fleet.md).
``frozen`` keeps dataclasses' own bookkeeping (``fields``, ``replace``, ``asdict``,
``__match_args__``, ``slots``) and gives every class the same five shared methods, which
behave as the generated ones do (the same comparison, the same hash of the same tuple, the
same errors); the ``__init__`` is written and compiled the first time the class is
instantiated, so a class a command never builds costs nothing more.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_kw: Any) -> Callable[[Any], Any]:
        return lambda f: f


T = TypeVar("T", bound=type)
_set = object.__setattr__
_MISSING = dataclasses.MISSING


def _values(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of those attributes (the one dataclasses compares and hashes)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        one = operator.attrgetter(names[0])
        return lambda self: (one(self),)
    return lambda _self: ()


def _init_source(cls: type) -> tuple[str, dict[str, Any]]:
    """The ``__init__`` dataclasses would write for a frozen ``cls``, and its globals."""
    env: dict[str, Any] = {"__set": _set, "__MISSING": _MISSING}
    params: list[str] = []
    kw_only: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):
        if f.default is not _MISSING:
            env[f"__d_{f.name}"] = f.default
            value = f"__d_{f.name}"
        elif f.default_factory is not _MISSING:
            env[f"__f_{f.name}"] = f.default_factory
            value = f"__f_{f.name}()"
        else:
            value = ""
        if not f.init:
            if value:
                body.append(f"__set(self, {f.name!r}, {value})")
            continue
        if f.default_factory is not _MISSING:
            param = f"{f.name}=__MISSING"
            body.append(f"__set(self, {f.name!r}, {value} if {f.name} is __MISSING else {f.name})")
        else:
            param = f"{f.name}={value}" if value else f.name
            body.append(f"__set(self, {f.name!r}, {f.name})")
        (kw_only if f.kw_only else params).append(param)
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    signature = ", ".join(["self", *params, *(["*", *kw_only] if kw_only else [])])
    lines = "\n".join(f"  {line}" for line in body or ["pass"])
    return f"def __init__({signature}):\n{lines}\n", env


def _lazy_init(cls: type) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        source, env = _init_source(cls)
        exec(source, env)
        real = env["__init__"]
        real.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = real  # type: ignore[misc]
        real(self, *args, **kwargs)

    return __init__


def _own(cls: type, name: str) -> bool:
    """Whether the class body defines ``name`` (dataclasses leave such a method alone; a body
    that defines ``__eq__`` alone gets ``__hash__ = None`` from Python, which is not one)."""
    if name == "__hash__" and cls.__dict__.get("__hash__", 0) is None:
        return "__eq__" not in cls.__dict__
    return name in cls.__dict__


def _make(given: T, slots: bool) -> T:
    cls: type = dataclasses.dataclass(init=False, repr=False, eq=False, slots=slots)(given)
    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields)
    pseudo = set(cls.__dict__["__dataclass_fields__"]) - set(names)
    if any("InitVar" in str(cls.__dict__["__dataclass_fields__"][n].type) for n in pseudo):
        raise TypeError(f"{cls.__qualname__}: @frozen has no InitVar; use @dataclass")
    compared = _values(tuple(f.name for f in fields if f.compare))
    hashed = _values(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
    shown = tuple(f.name for f in fields if f.repr)
    owner: type[Any] = cls

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return compared(self) == compared(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hashed(self))

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in shown)
        return f"{self.__class__.__qualname__}({inner})"

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is owner or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is owner or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)

    # pickle and copy restore a slotted object through setattr: past the frozen one here
    def __getstate__(self: Any) -> list[Any]:
        return [getattr(self, n) for n in names]

    def __setstate__(self: Any, state: list[Any]) -> None:
        for name, value in zip(names, state, strict=True):
            _set(self, name, value)

    methods: dict[str, Any] = {
        "__init__": _lazy_init(cls),
        "__eq__": __eq__,
        "__hash__": __hash__,
        "__repr__": __repr__,
        "__setattr__": __setattr__,
        "__delattr__": __delattr__,
    }
    if slots:
        methods.update(__getstate__=__getstate__, __setstate__=__setstate__)
    for name, method in methods.items():
        if not _own(cls, name):
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, method)
    return cls  # type: ignore[return-value] # the class given, remade with slots


@overload
def frozen(cls: T, /) -> T: ...
@overload
def frozen(*, slots: bool = False) -> Callable[[T], T]: ...
@dataclass_transform(frozen_default=True)
def frozen(cls: T | None = None, /, *, slots: bool = False) -> T | Callable[[T], T]:
    """``@frozen`` / ``@frozen(slots=True)``: ``@dataclass(frozen=True[, slots=True])``."""
    if cls is None:
        return lambda c: _make(c, slots)
    return _make(cls, slots)


class paused_gc:
    """``with paused_gc():`` — the cyclic collector off while many records are made and
    none is kept in a cycle (a scan's thousands of functions, a validate batch): its
    passes there find nothing and cost a tenth of the work. Put back as it was after."""

    __slots__ = ("enabled",)

    def __enter__(self) -> None:
        import gc

        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            import gc

            gc.enable()
