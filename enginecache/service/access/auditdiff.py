"""An audit event's details for people (the dashboard's Audit view): what the change moved, as
`field: old -> new`, and the rest as `field: value`, never raw JSON.

Where an action's details say what a value was (`was`, a release's `from_version`), the change is
that value and the one the action set: an engine's status (`engine.corrupt`: `status: READY ->
CORRUPT`), a job's, a model's, a user's role, an alias's version. The fields the change shows are not
repeated among the rest. Values are text: a list joined by commas, a mapping as `key=value`,
None as `-`. Imports nothing beyond the stdlib and `service.access.audit`'s names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from enginecache.service.access import audit

NONE = "-"


@dataclass(frozen=True)
class ReadableDetails:
    """`change`: `field: old -> new` ("" where the action moves nothing it names); `fields`: the
    other details as (field, value text), in their order."""

    change: str
    fields: tuple[tuple[str, str], ...]

    @property
    def rest(self) -> str:
        """The other fields in one line: `field: value; ...`."""
        return "; ".join(f"{k}: {v}" for k, v in self.fields)

    def lines(self) -> list[str]:
        """The change, then each other field, a line each."""
        return [line for line in (self.change, *(f"{k}: {v}" for k, v in self.fields)) if line]


# An engine's status after each audited change of it (db.engines.audited_action), and a deleted one's.
_ENGINE_STATUS = {
    audit.ENGINE_CORRUPT: "CORRUPT",
    audit.ENGINE_READY: "READY",
    audit.ENGINE_RETIRE: "RETIRED",
    "engine.tampered": "TAMPERED",
    "engine.proven": "READY",
    "engine.unproven": "UNPROVEN",
    audit.ENGINE_DELETE: "deleted",
}
# A model's status before and after.
_MODEL_STATUS = {audit.MODEL_CORRUPT: ("OK", "CORRUPT"), audit.MODEL_OK: ("CORRUPT", "OK")}

Change = tuple[str, str, str, tuple[str, ...]]  # field, old, new, the detail keys it shows


def text(value: Any) -> str:
    """A detail's value as text: None `-`, a list joined by `, `, a mapping `k=v, ...`, a bool yes/no."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={text(v)}" for k, v in value.items()) or NONE
    if isinstance(value, list | tuple):
        return ", ".join(text(v) for v in value) or NONE
    return str(value)


def _release(d: Mapping[str, Any]) -> Change | None:
    if "alias" not in d or "version" not in d:
        return None
    field = f"{d['alias']}" + (f" for {d['gpu_class']}" if d.get("gpu_class") else "")
    old = NONE
    if d.get("from") is not None:
        old = f"v{d['from_version']} (model {d['from']})" if d.get("from_version") else f"model {d['from']}"
    new = f"v{d['version']} (model {d.get('model_id')})"
    return field, old, new, ("alias", "gpu_class", "version", "model_id", "from", "from_version")


def _changes() -> dict[str, Callable[[Mapping[str, Any]], Change | None]]:
    table: dict[str, Callable[[Mapping[str, Any]], Change | None]] = {
        audit.ROLE_SET: lambda d: ("role", text(d.get("was")), text(d.get("role")), ("was", "role")),
        audit.ROLE_REMOVE: lambda d: ("role", text(d.get("was")), NONE, ("was",)),
        audit.JOB_CANCEL: lambda d: ("status", text(d.get("was")), text(d.get("status")), ("was", "status")),
        audit.RELEASE_PROMOTE: _release,
        audit.RELEASE_ROLLBACK: _release,
        "engine.remote_ok": lambda d: ("remote copy", text(d.get("was")), "matches", ("was",)),
    }
    for action, status in _ENGINE_STATUS.items():
        table[action] = _status_from_was(status)
    for action, (old, new) in _MODEL_STATUS.items():
        table[action] = _status(old, new)
    return table


def _status_from_was(new: str) -> Callable[[Mapping[str, Any]], Change | None]:
    return lambda d: ("status", text(d.get("was")), new, ("was",))


def _status(old: str, new: str) -> Callable[[Mapping[str, Any]], Change | None]:
    return lambda d: ("status", old, new, ())


_CHANGES = _changes()


def readable_details(action: str, details: Mapping[str, Any] | None) -> ReadableDetails:
    """`details` of an event of `action` for people (see the module's docstring)."""
    details = details or {}
    describe = _CHANGES.get(action)
    found = describe(details) if describe is not None else None
    shown: tuple[str, ...] = ()
    change = ""
    if found is not None:
        field, old, new, shown = found
        change = f"{field}: {old} -> {new}"
    return ReadableDetails(change, tuple((str(k), text(v)) for k, v in details.items() if k not in shown))
