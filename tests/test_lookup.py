"""The serving lookup's scans (`service.serving.lookup`): `find_engine`'s fallback and `explain_miss` answer
exactly what a scan of every READY engine of the model, read in full, answers (the implementation
before they read only a few columns); `find_ready_engine` is one probe of the cache-key index."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.backends.registry import get_backend
from enginecache.core.cachekey import FieldDiff, compute_cache_key, diff_ingredients
from enginecache.core.fingerprint import GpuInfo, HostFingerprint, host_fingerprint
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import MissError
from enginecache.service.builds.plan import (
    BuildPlan,
    BuildRequest,
    create_pending_engine,
    find_ready_engine,
    plan_build,
    ready_engine_query,
)
from enginecache.service.context import AppContext
from enginecache.service.jobs.refs import engine_ref, engine_targets
from enginecache.service.models.register import register_model
from enginecache.service.serving import lookup
from tests.modelfactory import make_mlp

TARGET_SETS: tuple[tuple[str, ...], ...] = (("sm86",), ("sm89",), ("sm75",), ("sm80", "sm86"), ("sm86", "sm89"))


def gpu_host(cc: str) -> HostFingerprint:
    gpu = GpuInfo(index=0, name="NVIDIA test GPU", uuid="GPU-test", compute_capability=cc, memory_total_bytes=2**34)
    return host_fingerprint().replace(hostname=f"host-{cc}", gpus=(gpu,))


def with_options(plan: BuildPlan, **options: Any) -> BuildPlan:
    build_options = {**plan.build_options, **options}
    ingredients = {**plan.ingredients, "build_options": build_options}
    return replace(plan, build_options=build_options, ingredients=ingredients, cache_key=compute_cache_key(ingredients))


def add_engine(app: AppContext, plan: BuildPlan, status: str = EngineStatus.READY, **changes: Any) -> int:
    """An engine row as the product writes it (`create_pending_engine`), then given `status`."""
    record = create_pending_engine(app, plan)
    with app.catalog.write() as session:
        row = session.get(EngineRecord, record.id)
        assert row is not None
        row.status = status
        for name, value in changes.items():
            setattr(row, name, value)
        session.add(row)
    return record.id or 0


# -- the oracle: the scans as they were (every READY engine of the model, read in full) --------


def _ready_engines(app: AppContext, model_id: int) -> list[EngineRecord]:
    with app.catalog.read() as session:
        query = (
            select(EngineRecord)
            .where(EngineRecord.model_id == model_id, EngineRecord.status == EngineStatus.READY)
            .order_by(col(EngineRecord.id).desc())
        )
        return list(session.exec(query).all())


def _loadable(engine: EngineRecord, host: HostFingerprint) -> bool:
    return get_backend(engine.backend).compatibility(engine_ref(engine), host).compatible


def _target_free(ingredients: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ingredients.items() if k != "target"}


def reference_find_engine(app: AppContext, plan: BuildPlan, host: HostFingerprint) -> int | None:
    exact = find_ready_engine(app, plan.cache_key)
    if exact is not None and _loadable(exact, host):
        return exact.id
    wanted = _target_free(plan.ingredients)
    for engine in _ready_engines(app, plan.model.id or 0):
        if _target_free(engine.key_ingredients) == wanted and _loadable(engine, host):
            return engine.id
    return exact.id if exact is not None else None


def reference_nearest(app: AppContext, plan: BuildPlan, host: HostFingerprint) -> tuple[int, list[FieldDiff]] | None:
    candidates = _ready_engines(app, plan.model.id or 0)
    if not candidates:
        return None
    scored = [(diff_ingredients(e.key_ingredients, plan.ingredients), e) for e in candidates]
    diffs, nearest = min(scored, key=lambda pair: (len(pair[0]), -(pair[1].id or 0)))
    backend = get_backend(nearest.backend)
    if not diffs and not backend.covers(engine_targets(nearest), host):
        diffs = [FieldDiff("target (host)", nearest.targets, backend.host_target(host))]
    return nearest.id or 0, diffs


# -- a small catalog: one model, engines over targets x precisions x options, some not READY ---


def fill_catalog(app: AppContext, models: Path) -> dict[str, BuildPlan]:
    """Two models (engines for one of them only) and the plans the engines were made from."""
    register_model(app, make_mlp(models / "mlp.onnx"), name="mlp")
    register_model(app, make_mlp(models / "other.onnx", seed=5), name="other")  # no engines at all
    rng = random.Random(3)
    plans: dict[str, BuildPlan] = {}
    for targets in TARGET_SETS:
        for precision in ("fp32", "fp16"):
            base = plan_build(app, BuildRequest(model="mlp", targets=targets, precision=precision))
            plans[f"{','.join(targets)} {precision}"] = base
            for level in (None, 1, 3):
                status = rng.choice([EngineStatus.READY] * 4 + [EngineStatus.FAILED, EngineStatus.RETIRED])
                add_engine(app, with_options(base, opt_level=level), status)
    ort = plan_build(app, BuildRequest(model="mlp", backend="ort"))
    plans["ort"] = ort
    add_engine(app, ort)
    add_engine(app, with_options(ort, opt_level=2))
    # Ties: two engines with the same ingredients but for the workspace (and one of them twice, newer).
    tied = with_options(plans["sm86 fp32"], workspace_bytes=2**30)
    add_engine(app, tied)
    add_engine(app, tied)
    # An engine whose ingredients carry one the plans lack (an older or newer key schema).
    odd = plans["sm89 fp16"]
    add_engine(app, odd, key_ingredients={**odd.ingredients, "calibration": {"digest": "abc"}})
    return plans


@pytest.fixture(scope="module")
def sqlite_catalog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, BuildPlan]]:
    """`fill_catalog` on SQLite, once per module: its home (copied for each test) and its plans."""
    root = tmp_path_factory.mktemp("lookup")
    app = AppContext.from_settings(root / "home")
    try:
        plans = fill_catalog(app, root)
    finally:
        app.close()  # SQLite checkpoints its WAL: the home is one consistent set of files
    return app.home, plans


@pytest.fixture
def catalog(
    catalog_ctx: AppContext, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[AppContext, dict[str, BuildPlan]]:
    """A small catalog: one model, engines over targets x precisions x options, some not READY, and
    a model without engines. On SQLite each test gets its own copy of one filled home (tests may add
    engines); on PostgreSQL it is filled for each test."""
    app = catalog_ctx
    if not app.db_url.startswith("sqlite"):
        return app, fill_catalog(app, tmp_path)
    home, plans = request.getfixturevalue("sqlite_catalog")
    app.close()  # nothing of it was opened yet: its home becomes the copy
    shutil.rmtree(app.home, ignore_errors=True)
    shutil.copytree(home, app.home)
    return app, plans


def miss_plans(plans: dict[str, BuildPlan]) -> list[BuildPlan]:
    """Requests built and not: every base plan, new options, the tied pair's workspace, other backends."""
    out = list(plans.values())
    out += [with_options(p, opt_level=5) for p in plans.values()]
    out += [with_options(p, workspace_bytes=2**30) for p in plans.values()]
    out += [with_options(p, workspace_bytes=2**31, opt_level=3) for p in plans.values()]
    return out


HOSTS = ("sm86", "sm89", "sm75", None)  # None: this GPU-less host


def hosts() -> list[HostFingerprint]:
    return [gpu_host(cc) if cc else host_fingerprint() for cc in HOSTS]


@pytest.mark.slow
def test_find_engine_answers_as_the_full_scan(catalog: tuple[AppContext, dict[str, BuildPlan]]) -> None:
    app, plans = catalog
    answers = []
    for plan in miss_plans(plans):
        for host in hosts():
            found = lookup.find_engine(app, plan, host)
            expected = reference_find_engine(app, plan, host)
            assert (found.id if found is not None else None) == expected, (plan.targets, plan.build_options, host)
            if found is not None:
                assert found.status == EngineStatus.READY and found.key_ingredients  # the full row
            answers.append(expected)
    assert any(a is None for a in answers) and any(a is not None for a in answers)


def test_fallback_finds_an_engine_whose_targets_cover_the_host(
    catalog: tuple[AppContext, dict[str, BuildPlan]],
) -> None:
    app, plans = catalog
    sm80 = plan_build(app, BuildRequest(model="mlp", targets=("sm80",), precision="fp16"))
    single = with_options(sm80, opt_level=4)  # no engine for sm80 alone
    wider = with_options(plans["sm80,sm86 fp16"], opt_level=4)
    engine_id = add_engine(app, wider)
    assert find_ready_engine(app, single.cache_key) is None
    found = lookup.find_engine(app, single, gpu_host("sm86"))
    assert found is not None and found.id == engine_id and found.targets == "sm80,sm86"
    assert lookup.find_engine(app, single, gpu_host("sm89")) is None  # sm80,sm86 does not cover an sm89


@pytest.mark.slow
def test_explain_miss_names_the_same_nearest_engine_and_diffs(catalog: tuple[AppContext, dict[str, BuildPlan]]) -> None:
    app, plans = catalog
    seen_diffs = set()
    for plan in miss_plans(plans):
        for host in hosts():
            err = lookup.explain_miss(app, plan, host)
            expected = reference_nearest(app, plan, host)
            assert expected is not None and err.nearest is not None
            nearest_id, diffs = expected
            assert err.nearest["id"] == nearest_id, (plan.targets, plan.build_options, host.gpus)
            assert err.diffs == diffs
            engine = next(e for e in _ready_engines(app, plan.model.id or 0) if e.id == nearest_id)
            assert err.nearest == {
                "id": engine.id,
                "backend": engine.backend,
                "precision": engine.precision,
                "targets": engine.targets,
                "created_at": engine.created_at.isoformat(),
            }
            assert f"nearest: engine {nearest_id} (" in str(err)
            seen_diffs.add(len(diffs))
    assert {0, 1, 2} <= seen_diffs  # exact keys (not loadable here), near misses and farther ones were asked


def test_ties_go_to_the_newest_engine(catalog: tuple[AppContext, dict[str, BuildPlan]]) -> None:
    app, plans = catalog
    tied = with_options(plans["sm86 fp32"], workspace_bytes=2**30)
    with app.catalog.read() as session:
        ids = session.execute(
            sa.select(col(EngineRecord.id)).where(col(EngineRecord.cache_key) == tied.cache_key)
        ).scalars()
        newest = max(ids)
    err = lookup.explain_miss(app, with_options(tied, opt_level=5), gpu_host("sm86"))
    assert err.nearest is not None and err.nearest["id"] == newest
    assert [d.field for d in err.diffs] == ["build_options.opt_level"]


def test_an_ingredient_the_plan_lacks_counts_as_a_difference(catalog: tuple[AppContext, dict[str, BuildPlan]]) -> None:
    app, plans = catalog
    err = lookup.explain_miss(app, plans["sm89 fp16"], gpu_host("sm89"))
    assert err.nearest is not None
    expected = reference_nearest(app, plans["sm89 fp16"], gpu_host("sm89"))
    assert expected is not None and err.nearest["id"] == expected[0] and err.diffs == expected[1]


def test_a_model_without_ready_engines_says_so(catalog: tuple[AppContext, dict[str, BuildPlan]]) -> None:
    app, _ = catalog
    plan = plan_build(app, BuildRequest(model="other", targets=("sm86",)))
    err = lookup.explain_miss(app, plan, gpu_host("sm86"))
    assert isinstance(err, MissError) and err.nearest is None
    assert str(err) == "no engine for other rtx fp32 for SM86; the model has no READY engine at all"
    assert lookup.find_engine(app, plan, gpu_host("sm86")) is None


def test_engine_columns_mirror_their_key_ingredients(catalog: tuple[AppContext, dict[str, BuildPlan]]) -> None:
    """What the scans filter on in SQL: the row's writer fills these columns from the plan's ingredients."""
    app, _ = catalog
    with app.catalog.read() as session:
        engines = session.exec(select(EngineRecord)).all()
    assert engines
    for e in engines:
        ingredients = e.key_ingredients
        assert (e.backend, e.backend_version, e.os) == (
            ingredients["backend"],
            ingredients["backend_version"],
            ingredients["os"],
        )
        assert e.precision == ingredients["precision"]["name"] and e.onnx_digest == ingredients["onnx_digest"]
        assert (e.precision_recipe, e.build_options, e.target_info) == (
            ingredients["precision"],
            ingredients["build_options"],
            ingredients["target"],
        ) or "calibration" in ingredients  # the fixture's one engine with an extra ingredient


def test_columns_that_do_not_mirror_the_ingredients_fall_back_to_them(
    catalog: tuple[AppContext, dict[str, BuildPlan]], tmp_path: Path
) -> None:
    """A row whose build_options column says more than its ingredients (never written so): the
    verified engine differs less than its columns claim, and the answer comes from the ingredients."""
    app, _ = catalog
    register_model(app, make_mlp(tmp_path / "third.onnx", seed=9), name="third")
    plan = plan_build(app, BuildRequest(model="third", targets=("sm86",)))
    skewed = add_engine(app, plan, build_options={**plan.build_options, "opt_level": 4})
    add_engine(app, with_options(plan, opt_level=2, workspace_bytes=2**30))
    err = lookup.explain_miss(app, plan, gpu_host("sm89"))
    expected = reference_nearest(app, plan, gpu_host("sm89"))
    assert expected is not None and err.nearest is not None
    assert err.nearest["id"] == expected[0] == skewed and err.diffs == expected[1]


@pytest.mark.parametrize("seed", range(5))
def test_count_diffs_is_the_number_of_differing_leaves(seed: int) -> None:
    rng = random.Random(seed)

    def tree(depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in rng.sample("abcdef", rng.randint(0, 5)):
            kind = rng.random()
            if depth and kind < 0.3:
                out[name] = tree(depth - 1)
            elif kind < 0.5:
                out[name] = rng.choice([None, 0, 1, 1.0, True, "x", [1, 2]])
            else:
                out[name] = rng.choice(["a", "b", 2, [1], {}, None])
        return out

    for _ in range(200):
        left, right = tree(3), tree(3)
        exact = len(diff_ingredients(left, right))
        assert lookup._count_diffs(left, right, 1 << 20) == exact
        for limit in range(exact + 2):
            counted = lookup._count_diffs(left, right, limit)
            assert counted == exact if exact <= limit else counted > limit


def test_find_ready_engine_is_one_probe_of_the_key_index(catalog: tuple[AppContext, dict[str, BuildPlan]]) -> None:
    app, plans = catalog
    plan = plans["ort"]
    found = find_ready_engine(app, plan.cache_key)
    assert found is not None and found.cache_key == plan.cache_key and found.status == EngineStatus.READY
    assert find_ready_engine(app, "0" * 64) is None
    statement = ready_engine_query().params(cache_key=plan.cache_key)
    engine = app.catalog.engine
    sql = str(statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        if app.catalog.is_sqlite:
            plan_text = " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
            assert "USING INDEX ix_engines_key_status (cache_key=? AND status=?)" in plan_text
        else:
            conn.exec_driver_sql("ANALYZE engines")  # a live catalog has statistics (bench/bench_catalog.py at scale)
            conn.exec_driver_sql("SET enable_seqscan = off")  # a table this small fits a page
            plan_text = " ".join(str(r[0]) for r in conn.exec_driver_sql("EXPLAIN " + sql))
            assert "ix_engines_key_status" in plan_text
