"""A model reference, read one way wherever a model is named: the CLI's MODEL arguments and `--model`
options (`build`, `engine list`, `model show`, `profiles`, `pull`, `ready`, `export`, `verify`) and
the service calls behind them (`service.models.register.get_model`, `service.models.releases.resolve_model`).

- `ID` (digits): that model.
- `NAME`: the name's newest version (the source model registered last under it); a listing that reads
  a name as a set (`engine list --model NAME`) covers every version of it (`ModelRef.scope_ids`).
- `NAME@vN`: version N of the name, the N-th source model registered under it (`service.models.releases`).
- `NAME@ALIAS`: the version the alias points at for this host's GPU class, else for every host.
- a digest, or a unique prefix of 12+ hex characters of one: that model.

A name without the version asked for is BadInputError naming the versions it has; a name, id or
digest the catalog lacks, or an alias not set, is NotFoundError naming what there is. `vN` is never
an alias (`check_alias` refuses it), so `NAME@v2` always means version 2.

Reads go through a `db.reader.RowSource` (the stdlib sqlite3, or SQLAlchemy Core), so a read command
resolves a reference without importing the ORM. How an alias's moves add up (a promote pushes, a
rollback pops: the top is where it points) is `alias_stack`, which `service.models.releases` uses too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enginecache.core.names import check_model_name
from enginecache.errors import AmbiguousError, BadInputError, NotFoundError

if TYPE_CHECKING:
    from enginecache.core.fingerprint import HostFingerprint
    from enginecache.db.reader import Column, RowSource

VERSION_PATTERN = re.compile(r"v([0-9]{1,9})")  # NAME@v2
ALIAS_PATTERN_HELP = "letters, digits, '-' and '_', starting with a letter, at most 64, and not v<number>"
DIGEST_PREFIX_MIN = 12

# A source model's version number within its name, as SQL on `models AS {m}` (NULL for a converted variant).
VERSION_SQL = (
    "CASE WHEN {m}.id IS NOT NULL AND {m}.parent_id IS NULL THEN (SELECT COUNT(*) FROM models AS v "
    "WHERE v.name = {m}.name AND v.parent_id IS NULL AND v.id <= {m}.id) END"
)

_ID: list[Column] = [("id", "")]
_MODEL: list[Column] = [("id", ""), ("name", ""), ("parent_id", "")]
_MOVE: list[Column] = [("name", ""), ("alias", ""), ("gpu_class", ""), ("action", ""), ("model_id", "")]


@dataclass(frozen=True)
class ModelRef:
    """What a reference resolved to: one model, its place among its name's versions, and how it was named."""

    model_id: int
    name: str
    version: int | None  # its number within its name; None for a converted variant (it has no versions)
    version_ids: tuple[int, ...]  # the name's versions' model ids, oldest first (empty for a variant)
    by_name: bool = False  # named by its name alone (NAME), not as one model (NAME@vN, NAME@ALIAS, id, digest)
    alias: str | None = None  # the alias it was named by
    alias_gpu_class: str = ""  # the GPU class that alias was set for ("" for every host)

    @property
    def scope_ids(self) -> tuple[int, ...]:
        """The models a listing of this reference covers: every version for a bare NAME, else this one."""
        return self.version_ids if self.by_name and self.version_ids else (self.model_id,)

    def describe(self) -> str:
        """Which model(s) the reference names, in words: `resnet, every version (v1 and v2); resnet@v2
        names one`, `resnet v1 (of v1 and v2)`, `resnet@prod: v2 (of v1 to v3)`."""
        if self.version is None:
            return f"{self.name} (model {self.model_id}, a converted variant)"
        versions = versions_text(len(self.version_ids))
        if self.by_name and len(self.version_ids) > 1:
            return f"{self.name}, every version ({versions}); {self.name}@v{self.version} names one"
        if self.alias is not None:
            scope = f" for {self.alias_gpu_class}" if self.alias_gpu_class else ""
            return f"{self.name}@{self.alias}{scope}: v{self.version} (of {versions})"
        return f"{self.name} v{self.version} (of {versions})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "name": self.name,
            "version": self.version,
            "versions": len(self.version_ids),
            "alias": self.alias,
            "alias_gpu_class": self.alias_gpu_class or None,
            "scope_ids": list(self.scope_ids),
        }


def versions_text(count: int) -> str:
    """`v1`, `v1 and v2`, `v1 to v5`."""
    if count <= 1:
        return "v1"
    return "v1 and v2" if count == 2 else f"v1 to v{count}"


def check_alias(alias: str) -> str:
    """`alias` where it is one (ALIAS_PATTERN_HELP); BadInputError otherwise. `v2` is not: it names a version."""
    if (
        not (0 < len(alias) <= 64 and alias[0].isascii() and alias[0].isalpha())
        or not all(c.isascii() and (c.isalnum() or c in "-_") for c in alias)
        or VERSION_PATTERN.fullmatch(alias)
    ):
        raise BadInputError(f"alias {alias!r} is not one: {ALIAS_PATTERN_HELP}")
    return alias


def host_gpu_class(host: HostFingerprint) -> str:
    """The GPU class an alias may be set for: this host's first GPU's compute capability, or ""."""
    return host.gpus[0].compute_capability if host.gpus else ""


def _this_host_gpu_class() -> str:
    from enginecache.core.fingerprint import host_fingerprint

    return host_gpu_class(host_fingerprint())


def alias_stack(moves: Iterable[tuple[str, int | None]]) -> list[int]:
    """The promotes of one alias still in effect, oldest first, from its moves (action, model id) in
    the order they were made: a promote pushes its model, a rollback pops the last. The last is where
    the alias points; empty where it points nowhere."""
    stack: list[int] = []
    for action, model_id in moves:
        if action == "promote" and model_id is not None:
            stack.append(int(model_id))
        elif stack:
            stack.pop()
    return stack


def alias_targets(source: RowSource, names: Sequence[str] | None = None) -> dict[tuple[str, str, str], int]:
    """(name, alias, GPU class) -> the model each alias in effect points at, for these names (None: all)."""
    where = ""
    params: dict[str, Any] = {}
    if names is not None:
        if not names:
            return {}
        where = " WHERE name IN (" + ", ".join(f":n{i}" for i in range(len(names))) + ")"
        params = {f"n{i}": name for i, name in enumerate(names)}
    sql = f"SELECT name, alias, gpu_class, action, model_id FROM alias_moves{where} ORDER BY id"
    moves: dict[tuple[str, str, str], list[tuple[str, int | None]]] = {}
    for name, alias, gpu, action, model_id in source.rows(sql, params, _MOVE):
        moves.setdefault((str(name), str(alias), str(gpu or "")), []).append((str(action), model_id))
    targets = {}
    for key, made in moves.items():
        stack = alias_stack(made)
        if stack:
            targets[key] = stack[-1]
    return targets


def version_ids(source: RowSource, name: str) -> tuple[int, ...]:
    """The model ids of the name's versions (its source models), oldest first: version N is the N-th."""
    sql = "SELECT id FROM models WHERE name = :name AND parent_id IS NULL ORDER BY id"
    return tuple(int(row[0]) for row in source.rows(sql, {"name": name}, _ID))


def resolve(source: RowSource, ref: str | int, *, gpu_class: Callable[[], str] | None = None) -> ModelRef:
    """The model `ref` names (module docstring). `gpu_class` gives the GPU class a `NAME@ALIAS` is
    resolved for (default: this host's), asked only where an alias is used."""
    text = str(ref)
    base, at, selector = text.partition("@")
    if at:
        return _resolve_selector(source, check_model_name(base), selector, gpu_class or _this_host_gpu_class)
    model_id, by_name = _find(source, text)
    rows = list(source.rows("SELECT id, name, parent_id FROM models WHERE id = :id", {"id": model_id}, _MODEL))
    if not rows:  # deleted between the two statements
        raise NotFoundError(f"no model {text!r} in the catalog")
    _, name, parent_id = rows[0]
    if parent_id is not None:
        return ModelRef(model_id, str(name), None, ())
    ids = version_ids(source, str(name))
    return ModelRef(model_id, str(name), ids.index(model_id) + 1, ids, by_name=by_name)


def _find(source: RowSource, text: str) -> tuple[int, bool]:
    """(the model id, whether the name found it) by id, name (its newest source model; a converted
    variant's name otherwise) or digest (prefix)."""
    if text.isdigit():
        for row in source.rows("SELECT id FROM models WHERE id = :id", {"id": int(text)}, _ID):
            return int(row[0]), False
    by_name = "SELECT id FROM models WHERE name = :name ORDER BY (parent_id IS NOT NULL), id DESC"
    for row in source.rows(by_name, {"name": text}, _ID, limit=1):
        return int(row[0]), True
    if len(text) >= DIGEST_PREFIX_MIN:
        found = list(source.rows("SELECT id FROM models WHERE digest LIKE :prefix", {"prefix": text + "%"}, _ID))
        if len(found) > 1:
            raise AmbiguousError(f"digest prefix {text!r} matches {len(found)} models")
        if found:
            return int(found[0][0]), False
    raise NotFoundError(f"no model {text!r} in the catalog (give a name, NAME@vN, NAME@ALIAS, an id or a digest)")


def _resolve_selector(source: RowSource, name: str, selector: str, gpu_class: Callable[[], str]) -> ModelRef:
    ids = version_ids(source, name)
    if not ids:
        raise NotFoundError(f"no model named {name!r} in the catalog")
    version = VERSION_PATTERN.fullmatch(selector)
    if version is not None:
        number = int(version.group(1))
        if not 1 <= number <= len(ids):
            raise BadInputError(f"model {name!r} has no version v{number}: its versions are {versions_text(len(ids))}")
        return ModelRef(ids[number - 1], name, number, ids)
    alias = check_alias(selector)
    targets = alias_targets(source, [name])
    gpu = gpu_class()
    for scope in ([gpu] if gpu else []) + [""]:
        model_id = targets.get((name, alias, scope))
        if model_id is not None:
            pointed = ids.index(model_id) + 1 if model_id in ids else None
            return ModelRef(model_id, name, pointed, ids, alias=alias, alias_gpu_class=scope)
    known = sorted({a if not g else f"{a} (for {g})" for (_, a, g) in targets})
    raise NotFoundError(
        f"alias {name}@{alias} is not set"
        + (f" (for {gpu} or for every host)" if gpu else "")
        + f"; {name}'s versions: {versions_text(len(ids))}; its aliases: {', '.join(known) or 'none'}"
    )
