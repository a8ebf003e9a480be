"""The cache key: sha256 of a canonical JSON of every ingredient that decides engine reuse.

Each ingredient is also kept as its own field so a miss can be explained field by field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEY_SCHEMA = 1

# Ingredient names, in the order they are shown.
INGREDIENTS: tuple[str, ...] = (
    "schema",
    "onnx_digest",
    "precision",
    "build_options",
    "backend",
    "backend_version",
    "target",
    "os",
)


# An ingredient (or a leaf of one) an imported engine's declaration and header do not establish: kept
# as this marker, never guessed, so the key of an import can equal no key a build computes.
UNKNOWN: dict[str, Any] = {"unknown": True}


def unknown_fields(ingredients: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted names of every ingredient (or leaf) that is `UNKNOWN`, in ingredient order."""
    found: list[str] = []
    for name, value in ingredients.items():
        if value == UNKNOWN:
            found.append(prefix + name)
        elif isinstance(value, Mapping):
            found.extend(unknown_fields(value, f"{prefix}{name}."))
    return found


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the bytes the key is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def compute_cache_key(ingredients: Mapping[str, Any]) -> str:
    missing = [name for name in INGREDIENTS if name not in ingredients]
    if missing:
        raise ValueError(f"cache key ingredients missing: {', '.join(missing)}")
    return canonical_digest({name: ingredients[name] for name in INGREDIENTS})


def canonical_digest(value: Any) -> str:
    """The sha256 of a value's canonical JSON."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


@dataclass(frozen=True)
class FieldDiff:
    """One ingredient that differs between two keys, with a dotted path into nested values."""

    field: str
    left: Any
    right: Any

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "left": self.left, "right": self.right}


def diff_ingredients(left: Mapping[str, Any], right: Mapping[str, Any], prefix: str = "") -> list[FieldDiff]:
    """Every leaf that differs between two ingredient mappings ("why was this a miss?")."""
    diffs: list[FieldDiff] = []
    for name in sorted(set(left) | set(right)):
        path = f"{prefix}{name}"
        a, b = left.get(name), right.get(name)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            diffs.extend(diff_ingredients(a, b, prefix=path + "."))
        elif a != b:
            diffs.append(FieldDiff(path, a, b))
    return diffs
