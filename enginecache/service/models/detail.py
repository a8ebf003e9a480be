"""A model as the dashboard shows it, in plain values (no catalog row reaches a view):
`ModelDetail` (its columns and its inspection) for its page, and `ModelRelease` (its version
within its name, the aliases pointing at it) for an engine's page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from enginecache.service.context import AppContext
from enginecache.service.models.register import get_model, model_to_dict
from enginecache.service.models.releases import AliasTarget, aliases_of_model, version_of


@dataclass(frozen=True)
class ModelDetail:
    """One stored model: a user's upload (a source model) or a precision-converted variant."""

    id: int
    name: str
    digest: str  # sha256 of the model's bundle
    filename: str
    store_path: str
    size_bytes: int
    parent_id: int | None  # the source model of a variant; None for a source model
    recipe: dict[str, Any]  # a variant's precision recipe; empty for a source model
    info: dict[str, Any]  # the model as `model show --json` prints it: columns, then its inspection


def model_detail(app: AppContext, ref: str | int) -> ModelDetail:
    """The model `ref` names (id, digest or name). Raises NotFoundError where there is none."""
    model = get_model(app, ref)
    return ModelDetail(
        id=model.id or 0,
        name=model.name,
        digest=model.digest,
        filename=model.filename,
        store_path=model.store_path,
        size_bytes=model.size_bytes,
        parent_id=model.parent_id,
        recipe=model.recipe,
        info=model_to_dict(app, model),
    )


@dataclass(frozen=True)
class ModelRelease:
    """Where a model stands among the versions of its name."""

    version: int  # 1 for the oldest; 0 where it is not a version of its name (a variant)
    aliases: tuple[AliasTarget, ...]  # the aliases pointing at it


def model_release(app: AppContext, model_id: int) -> ModelRelease:
    """The version and aliases of model `model_id`. Raises NotFoundError where there is none."""
    model = get_model(app, model_id)
    return ModelRelease(version_of(app, model), tuple(aliases_of_model(app, model)))
