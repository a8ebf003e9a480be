"""Value types without `dataclasses`: what a serving process's cache hit creates.

`import dataclasses` costs a new process ~7-8 ms (it imports `inspect`, which imports `ast`, `dis`,
`tokenize` ...) and every dataclass another ~0.3-0.6 ms to generate its methods; a TensorRT-RTX
INCOMPATIBLE verdict imports nothing else that pays for them. So the types a cache hit and the host
fingerprint create are plain classes with `__slots__` on these two bases, which give what a
`@dataclass` (`frozen=True`) gave them: keyword or positional construction in field order (each
class writes its own `__init__`), `__eq__` (same class, same field values), `__hash__` (frozen: of
the field values), a `Name(field=value, ...)` repr, pickling and `copy`, and `replace(**changes)`
for `dataclasses.replace`. A class names its fields in order as `__slots__ = _fields = (...)`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any, ClassVar, Self


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen value (as `dataclasses.FrozenInstanceError`)."""


class _Value:
    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]]  # the fields in order (each class's `__slots__`)

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


class Frozen(_Value):
    """A value that cannot be changed once made: `__init__` sets its fields with `object.__setattr__`."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash(self._astuple())

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


class Mutable(_Value):
    """A value whose fields may be assigned (unhashable, as a dataclass with `eq=True`)."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]
