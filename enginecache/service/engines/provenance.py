"""An engine's provenance in words, as `engine show` and the engine page say it: built here, or
imported (who, from where, what was declared, what the header proved, what is unknown, whether a
host has proven it). Plain text, not made printable: the caller does
(`service.readmodels.display.printable`, or Markdown-literal on the page)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BUILT_HERE = "built here"
IMPORTED = "imported"
IMPORTED_BUNDLE = "imported bundle"
# Each kind `provenance_kind` answers, with what it means (the coverage matrix's legend says these).
PROVENANCE_KINDS: dict[str, str] = {
    BUILT_HERE: "built by an enginecache worker or build",
    IMPORTED: "built elsewhere (trtexec, a CI script) and registered with `engine import`",
    IMPORTED_BUNDLE: "an engine of several files (config.json, rank<N>.engine, ...) registered with `engine import`",
}


def provenance_lines(provenance: Mapping[str, Any] | None) -> list[str]:
    """One line saying where the engine came from, then (an import) a line per recorded fact."""
    recorded = dict(provenance or {})
    if recorded.get("kind", "built") != "imported":
        return ["provenance: built here (by an enginecache worker or build)"]
    lines = [
        f"provenance: imported by {recorded.get('by')} ({recorded.get('origin')}) at {recorded.get('at')}",
        f"  from: {recorded.get('source')}",
    ]
    declared = {k: v for k, v in (recorded.get("declared") or {}).items() if v not in (None, [], "")}
    if declared:
        lines.append("  declared: " + ", ".join(f"{k} {_text(v)}" for k, v in declared.items()))
    header = recorded.get("header") or {}
    proven = {k: header.get(k) for k in ("format", "targets", "backend_version") if header.get(k)}
    lines.append(
        "  header proves: " + (", ".join(f"{k} {_text(v)}" for k, v in proven.items()) if proven else "nothing")
    )
    unknown = recorded.get("unknown") or []
    if unknown:
        lines.append("  unknown (not declared, never guessed): " + ", ".join(unknown))
    proof = recorded.get("proven")
    if proof:
        lines.append(f"  proven: loaded by {proof.get('by')} on {proof.get('host')} at {proof.get('at')}")
    else:
        lines.append("  proven: not yet (UNPROVEN until a host that can run it loads it: `enginecache test-load`)")
    return lines


def provenance_kind(provenance: Mapping[str, Any] | None) -> str:
    """`BUILT_HERE`, `IMPORTED`, or `IMPORTED_BUNDLE` (an engine of several files): a key of
    `PROVENANCE_KINDS`."""
    recorded = provenance or {}
    if recorded.get("kind") != "imported":
        return BUILT_HERE
    return IMPORTED_BUNDLE if recorded.get("bundle") else IMPORTED


def _text(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
