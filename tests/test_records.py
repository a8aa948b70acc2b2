# SPDX-License-Identifier: Apache-2.0
"""passthrough.records.frozen against the standard library's frozen dataclass it replaces:
the same constructor (defaults, factories, keyword-only fields, __post_init__), equality,
hash, repr, frozenness, replace/asdict, and pickling and copying of slotted classes."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from passthrough.records import frozen


@frozen(slots=True)
class Ours:
    """a record"""

    a: int
    b: str = "b"
    c: tuple[int, ...] = dataclasses.field(default_factory=tuple)
    d: int = dataclasses.field(default=0, compare=False)
    e: int = dataclasses.field(default=1, kw_only=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Theirs:
    """the same record"""

    a: int
    b: str = "b"
    c: tuple[int, ...] = dataclasses.field(default_factory=tuple)
    d: int = dataclasses.field(default=0, compare=False)
    e: int = dataclasses.field(default=1, kw_only=True)


@frozen
class Checked:
    """a record with a check"""

    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("negative")


@pytest.mark.parametrize(
    ("args", "kwargs"), [((1,), {}), ((1, "x", (2,), 5), {"e": 7}), ((), {"a": 3, "c": (1,)})]
)
def test_the_same_record_as_a_frozen_dataclass(args: tuple, kwargs: dict) -> None:  # type: ignore[type-arg]
    ours, theirs = Ours(*args, **kwargs), Theirs(*args, **kwargs)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    assert hash(ours) == hash(theirs)
    assert repr(ours).replace("Ours", "Theirs") == repr(theirs)
    assert ours == Ours(*args, **kwargs) and ours != theirs
    assert ours == dataclasses.replace(ours, d=99)  # d is not compared, as in theirs
    assert dataclasses.replace(ours, a=9).a == 9 and dataclasses.asdict(ours)["b"] == ours.b
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.a = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del ours.b  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(ours)) == ours and copy.deepcopy(ours) == ours


def test_the_constructor_refuses_what_a_dataclass_refuses() -> None:
    with pytest.raises(TypeError):
        Ours()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Ours(1, "b", (), 0, 5)  # type: ignore[misc] # e is keyword-only
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)
    assert Checked(2).n == 2 and Checked(2) == Checked(2)


@pytest.mark.parametrize("was_on", [True, False])
def test_paused_gc_puts_the_collector_back_as_it_was(was_on: bool) -> None:
    """A scan and a validate batch run with the collector off (records.paused_gc); the
    caller's setting comes back after, an error on the way out included."""
    import gc

    from passthrough.records import paused_gc

    before = gc.isenabled()
    try:
        gc.enable() if was_on else gc.disable()
        with paused_gc():
            assert not gc.isenabled()
        assert gc.isenabled() is was_on
        with pytest.raises(KeyError), paused_gc():
            assert not gc.isenabled()
            raise KeyError("x")
        assert gc.isenabled() is was_on
    finally:
        gc.enable() if before else gc.disable()
