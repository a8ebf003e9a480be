"""core.valuetype against the dataclasses it stands for: each value class behaves as its
`@dataclass` twin (construction, defaults, equality, hashing, repr, replace, pickling, frozenness)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from enginecache.core.backends.loadtypes import LoadSpec, PhaseTimer
from enginecache.core.valuetype import Frozen, FrozenInstanceError, Mutable, field


class Point(Frozen):
    x: int
    y: int = 0
    tags: dict[str, int] = field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PointDC:
    x: int
    y: int = 0
    tags: dict[str, int] = dataclasses.field(default_factory=dict)


class Pair(Frozen):
    a: int
    b: str = ""


@dataclasses.dataclass(frozen=True)
class PairDC:
    a: int
    b: str = ""


class Counter(Mutable):
    name: str
    count: int = 0

    __slots__ = ("seen",)

    def __post_init__(self) -> None:
        self.seen = self.count * 2


@dataclasses.dataclass
class CounterDC:
    name: str
    count: int = 0


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1,), {}),
    ((1, 2), {}),
    ((), {"x": 1, "y": 2}),
    ((1,), {"tags": {"a": 1}}),
    ((1, 2, {"b": 2}), {}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_a_frozen_value_is_made_compared_and_shown_as_its_dataclass(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    ours, theirs = Point(*args, **kwargs), PointDC(*args, **kwargs)
    assert (ours.x, ours.y, ours.tags) == (theirs.x, theirs.y, theirs.tags)
    assert repr(ours) == repr(theirs).replace("PointDC", "Point")
    assert ours == Point(*args, **kwargs) and ours != Point(99)
    assert ours.asdict() == dataclasses.asdict(theirs)
    assert ours.replace(y=5) == Point(ours.x, 5, ours.tags)
    assert pickle.loads(pickle.dumps(ours)) == ours and copy.copy(ours) == ours and copy.deepcopy(ours) == ours
    assert not hasattr(ours, "__dict__"), "a value has its fields as slots"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1, 2, {}, 4), {}), ((1,), {"x": 2}), ((1,), {"z": 3})],
    ids=["missing", "too many", "twice", "unknown"],
)
def test_wrong_arguments_raise_type_error_as_a_dataclass_does(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        PointDC(*args, **kwargs)
    with pytest.raises(TypeError):
        Point(*args, **kwargs)


def test_frozen_is_frozen_hashable_and_its_factory_default_fresh() -> None:
    point = Point(1)
    with pytest.raises(FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del point.y  # type: ignore[misc]
    assert hash(Pair(1, "x")) == hash(Pair(1, "x")) == hash(PairDC(1, "x"))
    assert Point(1).tags is not Point(1).tags


def test_mutable_is_assignable_unhashable_and_runs_post_init() -> None:
    counter, twin = Counter("a", 2), CounterDC("a", 2)
    counter.count += 1
    twin.count += 1
    assert counter.asdict() == dataclasses.asdict(twin) and counter.seen == 4
    with pytest.raises(TypeError):
        hash(counter)
    with pytest.raises(TypeError):
        hash(twin)


def test_the_load_types_keep_their_defaults() -> None:
    assert LoadSpec() == LoadSpec({}, "engine", None, ())
    assert PhaseTimer().phases == {} and PhaseTimer().phases is not PhaseTimer().phases
