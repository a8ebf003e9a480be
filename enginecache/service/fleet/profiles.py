"""Use case: a model's engines as NVIDIA NIM lists its "profiles": each one compatible or not with
this host and why, and the one this host would select (`enginecache profiles MODEL`).

The verdict is the backend's one compatibility rule (`Backend.compatibility`: library version, OS,
GPU compute capability or CPU target), decided from this host's fingerprint; it loads no library
and reads no blob (`enginecache check ID` adds the library's header check on a verified blob). A
RETIRED or FAILED engine is no profile; one that is not READY yet (PENDING) or no longer (CORRUPT) is
listed with its status as the reason and never selected. An UNPROVEN engine (`engine import`ed, no
host has loaded it yet) is judged by the same rule and listed, and selected only where asked for: pinned
by its id (`--engine N`), or with `Wanted.unproven`.

What a serving process will load narrows the candidates first (`Wanted`, the one rule `pull` and
`profiles` share with `load_or_build(spec)`'s pulled start): the backend and precision it asks for,
or the one engine it pins. A host with a GPU is never given an engine for its CPU unless the caller
allows it (`allow_cpu`): with no engine for its GPU nothing is selected, and pull exits 1 saying so.

Selection among the compatible READY candidates, in this documented order:
0. an engine for one of this host's GPUs (its targets name the GPU's compute capability) before one
   for its CPU: a host with a GPU is given one to use it;
1. an engine built for exactly this host's target (one target: this GPU's compute capability, or
   this CPU's target) before one whose target list merely includes it (a TensorRT engine built for
   one compute capability is tuned for it);
2. the precision asked for, where one is; else the preference order `PRECISION_PREFERENCE`: the
   float precisions first (fp16, bf16, then fp32), then the quantized ones (fp8, int8), whose
   accuracy depends on their calibration, which an automatic choice should not assume;
3. the newest (the highest id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlmodel import col, select

from enginecache.core.backends.registry import get_backend
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.verdicts import Verdict
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.service.context import AppContext
from enginecache.service.engines.provenance import provenance_kind
from enginecache.service.jobs.refs import engine_ref, engine_targets
from enginecache.service.models.releases import AliasTarget, resolve_model

PRECISION_PREFERENCE = ("fp16", "bf16", "fp32", "fp8", "int8")


@dataclass(frozen=True)
class Wanted:
    """What the serving process will load: its backend and precision where it names them, one engine
    where it pins one, and whether a CPU engine may stand in on a host with a GPU."""

    backend: str | None = None
    precision: str | None = None
    engine_id: int | None = None
    allow_cpu: bool = False
    unproven: bool = False  # an UNPROVEN engine may be selected (one pinned by `engine_id` always may)

    def selectable(self, profile: Profile) -> bool:
        """Whether `profile`'s status lets it be selected: READY, or UNPROVEN where asked for."""
        if profile.status == EngineStatus.READY:
            return True
        return profile.status == EngineStatus.UNPROVEN and (self.unproven or self.engine_id == profile.engine_id)

    def admits(self, profile: Profile, host_has_gpu: bool) -> bool:
        """Whether `profile` is a candidate at all (compatibility and status are judged apart)."""
        if self.engine_id is not None and profile.engine_id != self.engine_id:
            return False
        if self.backend is not None and profile.backend != self.backend:
            return False
        if self.precision is not None and profile.precision != self.precision:
            return False
        return profile.on_gpu or not host_has_gpu or self.allow_cpu

    def describe(self) -> str:
        """The request in words, for a refusal: `backend ort, precision fp32`, or `any engine`."""
        parts = [
            f"engine {self.engine_id}" if self.engine_id is not None else "",
            f"backend {self.backend}" if self.backend else "",
            f"precision {self.precision}" if self.precision else "",
        ]
        return ", ".join(p for p in parts if p) or "any engine"


@dataclass(frozen=True)
class Profile:
    """One engine of the model, judged for this host."""

    engine_id: int
    backend: str
    backend_version: str
    precision: str
    targets: tuple[str, ...]
    status: str
    verdict: Verdict  # COMPATIBLE | INCOMPATIBLE | UNKNOWN
    reason: str
    on_gpu: bool = False  # built for one of this host's GPUs
    selected: bool = False
    provenance: str = "built here"  # `service.engines.provenance.provenance_kind`: built here, imported (bundle)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "backend": self.backend,
            "backend_version": self.backend_version,
            "precision": self.precision,
            "targets": list(self.targets),
            "status": self.status,
            "verdict": str(self.verdict),
            "reason": self.reason,
            "on_gpu": self.on_gpu,
            "selected": self.selected,
            "provenance": self.provenance,
        }


@dataclass(frozen=True)
class Profiles:
    model_id: int
    model: str
    host: str
    profiles: tuple[Profile, ...]
    release: AliasTarget | None = None  # where `MODEL@ALIAS` was asked for: the alias it resolved

    @property
    def selected(self) -> Profile | None:
        return next((p for p in self.profiles if p.selected), None)

    def to_dict(self) -> dict[str, Any]:
        chosen = self.selected
        return {
            "model_id": self.model_id,
            "model": self.model,
            "host": self.host,
            "release": self.release.to_dict() if self.release else None,
            "selected_engine_id": chosen.engine_id if chosen else None,
            "profiles": [p.to_dict() for p in self.profiles],
        }


def _judge(engine: EngineRecord, host: HostFingerprint) -> Profile:
    targets = engine_targets(engine)
    if engine.status not in (EngineStatus.READY, EngineStatus.UNPROVEN):
        verdict, reason = Verdict.UNKNOWN, f"engine {engine.id} is {engine.status}: there is no engine to load"
    else:
        result = get_backend(engine.backend).compatibility(engine_ref(engine), host)
        verdict, reason = result.verdict, result.reason
        if engine.status == EngineStatus.UNPROVEN:
            reason = f"UNPROVEN (imported; no host has loaded it yet, selected only when pinned): {reason}"
    return Profile(
        engine_id=engine.id or 0,
        backend=engine.backend,
        backend_version=engine.backend_version,
        precision=engine.precision,
        targets=targets,
        status=str(engine.status),
        verdict=verdict,
        reason=reason,
        on_gpu=any(gpu.compute_capability in targets for gpu in host.gpus),
        provenance=provenance_kind(engine.provenance),
    )


def selection_rank(profile: Profile, precision: str | None = None) -> tuple[int, int, int, int]:
    """Smaller is preferred (module docstring): this host's GPU, exact target, precision, newest."""
    if precision is not None:
        wanted = 0 if profile.precision == precision else len(PRECISION_PREFERENCE)
    else:
        wanted = (
            PRECISION_PREFERENCE.index(profile.precision)
            if profile.precision in PRECISION_PREFERENCE
            else len(PRECISION_PREFERENCE)
        )
    return (0 if profile.on_gpu else 1, 0 if len(profile.targets) == 1 else 1, wanted, -profile.engine_id)


def select_profile(
    profiles: Sequence[Profile], wanted: Wanted | None = None, *, host_has_gpu: bool = False
) -> Profile | None:
    """The compatible READY profile this host takes among those `wanted` admits (an UNPROVEN one
    only where `wanted` asks for it), or None."""
    wanted = wanted or Wanted()
    candidates = [
        p
        for p in profiles
        if p.verdict == Verdict.COMPATIBLE and wanted.selectable(p) and wanted.admits(p, host_has_gpu)
    ]
    return min(candidates, key=lambda p: selection_rank(p, wanted.precision), default=None)


def model_profiles(
    app: AppContext, model_ref: str | int, *, wanted: Wanted | None = None, host: HostFingerprint | None = None
) -> Profiles:
    """Every engine of the model (a name, id, digest, or `NAME@ALIAS`: `service.models.releases`; newest
    first, RETIRED and FAILED ones left out: neither has an engine to load), judged for `host`
    (default: this one), with the one `select_profile` takes for `wanted` marked. An unknown model
    or an unset alias raises NotFoundError."""
    host = host or host_fingerprint()
    model, release = resolve_model(app, model_ref, host)
    query = (
        select(EngineRecord)
        .where(
            EngineRecord.model_id == model.id,
            col(EngineRecord.status).not_in((EngineStatus.RETIRED, EngineStatus.FAILED)),
        )
        .order_by(col(EngineRecord.id).desc())
    )
    with app.catalog.read() as session:
        engines = list(session.exec(query).all())
    judged = [_judge(engine, host) for engine in engines]
    chosen = select_profile(judged, wanted, host_has_gpu=bool(host.gpus))
    marked = tuple(
        replace(p, selected=True) if chosen is not None and p.engine_id == chosen.engine_id else p for p in judged
    )
    return Profiles(model.id or 0, model.name, host.hostname, marked, release)
