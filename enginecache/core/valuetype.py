"""Value types without `dataclasses`, for what a serving process's cache hit and the host fingerprint
create (docs/performance.md says what `dataclasses` would cost a new process there).

A class on one of the two bases declares its fields as a dataclass does, annotated in order, a
default where it has one (`field(default_factory=...)` for a fresh mutable one), and gets what
`@dataclass` (`frozen=True` on `Frozen`) gives: an `__init__` taking the fields positionally or by
name, `__slots__` of its fields, `__eq__` (same class, same field values), `__hash__` (frozen: of the
field values), a `Name(field=value, ...)` repr, pickling and `copy`, `replace(**changes)` for
`dataclasses.replace`, and `__post_init__` where it defines one. Type checkers see the bases as
dataclass transforms (PEP 681). A class lists further attributes that are no fields in `__slots__`.
tests/test_valuetype.py holds them to the dataclasses they stand for.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, Self, dataclass_transform
else:

    def dataclass_transform(**_options: object) -> object:
        return lambda cls: cls


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen value (as `dataclasses.FrozenInstanceError`)."""


class _Factory:
    """A field's default made afresh for each value (`field(default_factory=...)`)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], Any]) -> Any:
    """`dataclasses.field(default_factory=...)`: the default is `default_factory()`, one per value."""
    return _Factory(default_factory)


class _ValueType(type):
    """Makes a value class's fields (its annotations, ClassVars aside) its `__slots__`, and takes
    their defaults out of the class into `_defaults`."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> _ValueType:
        annotations = namespace.get("__annotations__", {})
        fields = tuple(
            n for n, kind in annotations.items() if not str(kind).startswith(("ClassVar", "typing.ClassVar"))
        )
        if fields:
            namespace["_fields"] = fields
            namespace["_defaults"] = {n: namespace.pop(n) for n in fields if n in namespace}
            namespace["__slots__"] = fields + tuple(namespace.get("__slots__", ()))
        else:
            namespace.setdefault("__slots__", ())
        return super().__new__(mcs, name, bases, namespace)


class _Value(metaclass=_ValueType):
    _fields: ClassVar[tuple[str, ...]] = ()  # the fields in order
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = self._fields
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes {len(fields)} arguments, {len(args)} given")
        values = dict(zip(fields, args, strict=False))
        for name, value in kwargs.items():
            if name not in fields:
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {name!r}")
            if name in values:
                raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
            values[name] = value
        put = object.__setattr__
        for name in fields:
            if name in values:
                put(self, name, values[name])
            elif name in self._defaults:
                default = self._defaults[name]
                put(self, name, default.make() if isinstance(default, _Factory) else default)
            else:
                raise TypeError(f"{type(self).__name__}() missing the argument {name!r}")
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def _astuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._astuple() == other._astuple()
        return NotImplemented

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{self.__class__.__qualname__}({fields})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, self._astuple())

    def asdict(self) -> dict[str, Any]:
        """The fields by name, values as they are (not recursed into, unlike `dataclasses.asdict`)."""
        return {name: getattr(self, name) for name in self._fields}

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` (as `dataclasses.replace`)."""
        return self.__class__(**{**self.asdict(), **changes})


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
class Frozen(_Value):
    """A value that cannot be changed once made (`__post_init__` sets with `object.__setattr__`)."""

    def __hash__(self) -> int:
        return hash(self._astuple())

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


@dataclass_transform(field_specifiers=(field,))
class Mutable(_Value):
    """A value whose fields may be assigned (unhashable, as a dataclass with `eq=True`)."""

    __hash__ = None  # type: ignore[assignment]
