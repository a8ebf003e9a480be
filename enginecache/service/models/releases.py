"""Use case: releases, as MLflow gives models versions and mutable aliases (`enginecache release`).

- **Versions**: a model name's versions are its source models, the bytes registered under that name
  (`model add --new-version`, a CI prebuild's `path:`), numbered 1, 2, ... in the order they were
  registered. New bytes under a taken name are a new version, never a silent takeover.
- **Aliases**: `prod`, `canary`, ... point a name at one version, for every host or for one GPU class
  (`prod` on hosts whose GPU is SM86 may point elsewhere than `prod` for the rest: `--gpu sm86`).
  `promote` points an alias at a version; `rollback` takes the last promote back, so the alias
  points where it pointed before it (a stack: each rollback goes one further back). Every move is a
  row of `alias_moves`, never updated, and an audit event (`release.promote`, `release.rollback`);
  moving an alias needs the operator role.
- **Resolving** a reference (`resolve_model`, used by `pull`, `profiles`, `ready --model` and
  `export`; every other command names models through `get_model`) is `service.readmodels.modelrefs`,
  the one reader of `NAME`, `NAME@vN`, `NAME@ALIAS`, ids and digests: an alias resolves to its target
  for this host's GPU class where one is set, else to its target for every host; `NAME` alone is the
  newest version. `vN` is never an alias: `NAME@v2` is version 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.names import check_model_name
from enginecache.db.models import AliasMoveRecord, ModelRecord
from enginecache.errors import BadInputError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.models.register import get_model
from enginecache.service.readmodels import modelrefs
from enginecache.service.readmodels.listing import catalog_rows
from enginecache.service.readmodels.modelrefs import ALIAS_PATTERN_HELP as ALIAS_PATTERN_HELP  # re-exported
from enginecache.service.readmodels.modelrefs import host_gpu_class as host_gpu_class  # re-exported


@dataclass(frozen=True)
class AliasTarget:
    name: str
    alias: str
    gpu_class: str  # "" for every host
    model_id: int
    version: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "alias": self.alias,
            "gpu_class": self.gpu_class or None,
            "model_id": self.model_id,
            "version": self.version,
        }


def _check_alias(alias: str) -> str:
    return modelrefs.check_alias(alias)


def _check_gpu_class(gpu_class: str | None) -> str:
    value = (gpu_class or "").strip().lower()
    if value and not (value.startswith("sm") and value[2:].isdigit()):
        raise BadInputError(f"GPU class {gpu_class!r} is not a compute capability such as sm86")
    return value


def versions(app: AppContext, name: str) -> list[ModelRecord]:
    """The name's versions, oldest first (version N is the N-th)."""
    query = (
        select(ModelRecord)
        .where(ModelRecord.name == name, col(ModelRecord.parent_id).is_(None))
        .order_by(col(ModelRecord.id))
    )
    with app.catalog.read() as session:
        return list(session.exec(query).all())


def version_of(app: AppContext, model: ModelRecord) -> int:
    """The version number of a source model within its name."""
    ids = [m.id for m in versions(app, model.name)]
    return ids.index(model.id) + 1 if model.id in ids else 0


def _stack(app: AppContext, name: str, alias: str, gpu_class: str) -> list[int]:
    """The alias's promotes still in effect, oldest first (the last is where it points)."""
    query = (
        select(AliasMoveRecord)
        .where(AliasMoveRecord.name == name, AliasMoveRecord.alias == alias, AliasMoveRecord.gpu_class == gpu_class)
        .order_by(col(AliasMoveRecord.id))
    )
    with app.catalog.read() as session:
        return modelrefs.alias_stack((move.action, move.model_id) for move in session.exec(query))


def _target(app: AppContext, name: str, alias: str, gpu_class: str, model_id: int) -> AliasTarget:
    ids = [m.id for m in versions(app, name)]
    return AliasTarget(name, alias, gpu_class, model_id, ids.index(model_id) + 1 if model_id in ids else 0)


def _move(app: AppContext, name: str, alias: str, gpu_class: str, action: str, model_id: int | None) -> None:
    actor = audit.current_actor()
    with app.catalog.write() as session:
        session.add(
            AliasMoveRecord(
                name=name, alias=alias, gpu_class=gpu_class, action=action, model_id=model_id, actor=actor.name
            )
        )


def promote(
    app: AppContext, name: str, alias: str, *, version: int | None = None, gpu_class: str | None = None
) -> AliasTarget:
    """Point `alias` of `name` (for `gpu_class`, or every host) at `version` (default: the newest)."""
    access.require(app, "release")
    check_model_name(name)
    alias, gpu = _check_alias(alias), _check_gpu_class(gpu_class)
    known = versions(app, name)
    if not known:
        raise NotFoundError(f"no model named {name!r} in the catalog")
    number = version if version is not None else len(known)
    if not 1 <= number <= len(known):
        raise BadInputError(f"model {name!r} has versions 1 to {len(known)}, not {number}")
    model = known[number - 1]
    stack = _stack(app, name, alias, gpu)
    _move(app, name, alias, gpu, "promote", model.id)
    target = _target(app, name, alias, gpu, model.id or 0)
    audit.record(app, audit.RELEASE_PROMOTE, f"model {model.id}", {**target.to_dict(), **_was(known, stack)})
    return target


def rollback(app: AppContext, name: str, alias: str, *, gpu_class: str | None = None) -> AliasTarget:
    """Take the alias's last promote back; NotFoundError where the catalog has no model of that name,
    BadInputError where there is nothing to go back to."""
    access.require(app, "release")
    check_model_name(name)
    alias, gpu = _check_alias(alias), _check_gpu_class(gpu_class)
    if not versions(app, name):
        raise NotFoundError(f"no model named {name!r} in the catalog")
    stack = _stack(app, name, alias, gpu)
    shown = f"{name}@{alias}" + (f" for {gpu}" if gpu else "")
    if len(stack) < 2:
        raise BadInputError(f"{shown} has no earlier target to roll back to (promotes in effect: {len(stack)})")
    _move(app, name, alias, gpu, "rollback", None)
    target = _target(app, name, alias, gpu, stack[-2])
    was = _was(versions(app, name), stack)
    audit.record(app, audit.RELEASE_ROLLBACK, f"model {target.model_id}", {**target.to_dict(), **was})
    return target


def _was(known: list[ModelRecord], stack: list[int]) -> dict[str, int | None]:
    """Where the alias pointed before a move, for its audit row: `from` (a model id) and
    `from_version` (0: a model no longer among the name's versions), both None where it pointed
    nowhere."""
    if not stack:
        return {"from": None, "from_version": None}
    ids = [m.id for m in known]
    return {"from": stack[-1], "from_version": ids.index(stack[-1]) + 1 if stack[-1] in ids else 0}


def aliases(app: AppContext, name: str) -> list[AliasTarget]:
    """Every alias of `name` in effect, by alias then GPU class (every host first)."""
    query = sa.select(col(AliasMoveRecord.alias), col(AliasMoveRecord.gpu_class)).where(
        col(AliasMoveRecord.name) == name
    )
    with app.catalog.read() as session:
        keys = sorted({(str(alias), str(gpu)) for alias, gpu in session.execute(query)})
    found = []
    for alias, gpu in keys:
        stack = _stack(app, name, alias, gpu)
        if stack:
            found.append(_target(app, name, alias, gpu, stack[-1]))
    return found


def aliases_of_model(app: AppContext, model: ModelRecord) -> list[AliasTarget]:
    """The aliases that point at this version (for an engine's page: its model's aliases)."""
    return [a for a in aliases(app, model.name) if a.model_id == model.id]


def resolve_alias(app: AppContext, name: str, alias: str, host: HostFingerprint | None = None) -> AliasTarget:
    """Where `name@alias` points for this host (module docstring); NotFoundError where it is unset."""
    _model, target = resolve_model(app, f"{check_model_name(name)}@{_check_alias(alias)}", host)
    assert target is not None  # an alias named it
    return target


def resolve_model(
    app: AppContext, ref: str | int, host: HostFingerprint | None = None
) -> tuple[ModelRecord, AliasTarget | None]:
    """The model a reference names (`service.readmodels.modelrefs`), and the alias target where an alias
    named it (resolved for `host`'s GPU class, default this host's)."""
    with catalog_rows(app) as source:
        found = modelrefs.resolve(source, ref, gpu_class=lambda: host_gpu_class(host or host_fingerprint()))
    target = None
    if found.alias is not None:
        target = AliasTarget(found.name, found.alias, found.alias_gpu_class, found.model_id, found.version or 0)
    return get_model(app, found.model_id), target
