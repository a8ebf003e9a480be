"""A build's source bytes at its precision: the model itself for fp32, else its converted variant.

The variant (fp16, bf16, int8 or fp8 ONNX) is converted once per source and recipe and stored as a
model of its own, linked to its source (`parent_id`) and found again by `recipe_key`; every later
build of that precision reuses it. What the converter and the backend read is the bundle as
`service.models.verify.stage_bundle` stages it, verified. Called by `service.builds.plan.run_build`.
"""

from __future__ import annotations

import logging
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from enginecache.core.cachekey import canonical_digest
from enginecache.core.precision import PrecisionSpec, convert_precision
from enginecache.core.precision.native import computes_in
from enginecache.db.models import ModelRecord, ModelStatus
from enginecache.errors import IntegrityCheckError
from enginecache.service.context import AppContext
from enginecache.service.models.register import model_path, register_model
from enginecache.service.models.verify import stage_bundle

logger = logging.getLogger(__name__)


def recipe_key(source_digest: str, recipe: dict[str, Any]) -> str:
    return canonical_digest({"source": source_digest, "recipe": recipe})


def precision_variant(
    app: AppContext,
    model: ModelRecord,
    precision: PrecisionSpec,
    recipe: dict[str, Any],
    input_shapes: dict[str, tuple[int, ...]],
    work: Path,
    *,
    leases: ExitStack | None = None,
) -> tuple[ModelRecord, Path, tuple[str, ...]]:
    """The model to build from and a verified private copy of its bundle under `work`
    (`stage_bundle`): the source for fp32 or for a precision its graph already computes in
    (`core.precision.native.computes_in`), else its stored converted variant. A source that does not
    hash to its digest is marked CORRUPT and fails the build (IntegrityCheckError); a CORRUPT variant is
    converted again from the (verified) source: the same bytes repair it in place (`register_model`),
    other bytes become a new variant of the recipe. `leases`: `stage_bundle`'s, for every bundle
    staged here (linked under read leases the caller checks once its readers are done)."""
    if not precision.precision or precision.precision == "fp32":
        return model, stage_bundle(app, model, work / "source", leases=leases), ()
    if computes_in(model_path(app, model), precision.precision):  # the graph alone; the build reads it verified
        note = f"{model.name} already computes in {precision.precision}: built as exported, no conversion"
        return model, stage_bundle(app, model, work / "source", leases=leases), (note,)
    key = recipe_key(model.digest, recipe)
    query = select(ModelRecord).where(ModelRecord.recipe_key == key)
    ok_first = (col(ModelRecord.status) != ModelStatus.OK, col(ModelRecord.id))  # then the oldest
    with app.catalog.read() as session:
        existing = session.exec(query.order_by(*ok_first)).first()
    notes: tuple[str, ...] = ()
    if existing is not None:
        try:
            staged = stage_bundle(app, existing, work / "variant", leases=leases)
        except IntegrityCheckError as err:
            logger.warning("converting %s again: its stored variant is corrupt (%s)", model.name, err)
            notes = (f"stored {precision.precision} variant (model {existing.id}) was CORRUPT: converted again",)
            shutil.rmtree(work / "variant", ignore_errors=True)  # absent where the fetch failed first
        else:
            return existing, staged, tuple(str(w) for w in existing.recipe.get("warnings", []))
    converted = convert_precision(
        # a verified copy: converters load it with onnx, which refuses external data of several hard links
        stage_bundle(app, model, work / "source"),
        precision,
        work / "convert",
        input_shapes=input_shapes,
    )
    recorded = {**converted.recipe, "warnings": list(converted.warnings), "seconds": round(converted.seconds, 3)}
    registered = register_model(
        app,
        converted.path,
        name=f"{model.name}.{precision.precision}",
        parent_id=model.id,
        recipe=recorded,
        recipe_key=key,
    )
    # the stored variant, as the backend reads it
    staged = stage_bundle(app, registered.model, work / "variant", leases=leases)
    return registered.model, staged, (*notes, *converted.warnings)
