"""Finding things on the dashboard (issue 12): search by model name or digest prefix on Models and
Engines, filters kept in the URL, variants under their source with engine counts that add up, and
Overview's failures once each with the whole reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord
from enginecache.service.models.register import register_model
from enginecache.service.readmodels.models import grouped, model_rows
from tests.dashboardkit import TIMEOUT, Seeded, add_failed_build, frame, plain, rtx_engine, view
from tests.modelfactory import make_mlp


def _url_view(name: str, **params: str) -> AppTest:
    """A view opened from a link: its query parameters set before the first run."""
    sets = "".join(f"st.query_params[{k!r}] = {v!r}\n" for k, v in params.items())
    script = f"import streamlit as st\n{sets}from enginecache.dashboard.views import {name}\n{name}.render()\n"
    return AppTest.from_string(script, default_timeout=TIMEOUT)


def _variant(seeded: Seeded) -> ModelRecord:
    """A converted fp16 variant of the seeded model, with one engine built from it."""
    with seeded.app.catalog.write() as session:
        source = session.get(ModelRecord, seeded.model_id)
        assert source is not None
        variant = ModelRecord(
            name="convnet.fp16",
            digest="ab" * 32,
            filename="convnet.fp16.onnx",
            store_path="models/x",
            size_bytes=1,
            parent_id=source.id,
            info={},
        )
        session.add(variant)
        session.flush()
        session.add(rtx_engine(seeded.model_id, "c" * 64, variant_model_id=variant.id, onnx_digest=variant.digest))
    return variant


def test_variants_sit_under_their_source_and_their_engines_add_up(seeded: Seeded) -> None:
    variant = _variant(seeded)
    rows = grouped(model_rows(seeded.app))
    assert [(r.name, r.engines) for r in rows] == [("convnet", 1), ("convnet.fp16", 1)]
    assert rows[0].family_engines == 2, "the source's own and its variant's"
    at = view("models").run()
    assert not at.exception
    table = frame(at, "name", "kind", "engines", "with variants")
    assert table["name"].tolist() == ["convnet", "  ↳ convnet.fp16"]
    assert table["kind"].tolist() == ["source", "variant of convnet"], "names, not ids"
    assert int(table.loc[0, "with variants"]) == table["engines"].sum() == 2
    assert variant.id is not None


@pytest.mark.slow
def test_models_are_found_by_name_or_digest_prefix_and_the_search_is_in_the_url(seeded: Seeded, tmp_path: Path) -> None:
    other = register_model(seeded.app, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    at = view("models").run()
    at.text_input(key="models_search").set_value("CONV").run()
    assert frame(at, "name", "kind")["name"].tolist() == ["convnet"]
    assert at.query_params["q"] == "CONV"
    at.text_input(key="models_search").set_value(other.digest[:10]).run()
    assert frame(at, "name", "kind")["name"].tolist() == ["mlp"]
    at = _url_view("models", q="mlp")  # a link reproduces the view
    at.run()
    assert frame(at, "name", "kind")["name"].tolist() == ["mlp"]
    at = _url_view("models", model=str(seeded.model_id))
    at.run()
    assert at.selectbox(key="models_detail").value == seeded.model_id


def test_engines_are_found_by_model_name_or_digest_and_filters_come_from_the_url(seeded: Seeded) -> None:
    with seeded.app.catalog.read() as session:
        engine = session.get(EngineRecord, seeded.engine_id)
    assert engine is not None and engine.sha256 is not None
    at = view("engines").run()
    at.text_input(key="engines_f_search").set_value("nothing-like-this").run()
    assert "0 engine(s) match" in " ".join(c.value for c in at.caption)
    at.text_input(key="engines_f_search").set_value(engine.sha256[:12]).run()
    assert frame(at, "id", "sha256")["id"].tolist() == [seeded.engine_id]
    at.selectbox(key="engines_f_precision").set_value("fp32").run()
    assert at.query_params["precision"] == "fp32" and at.query_params["q"] == engine.sha256[:12]
    at = _url_view("engines", precision="fp16", model=str(seeded.model_id))
    at.run()
    assert at.selectbox(key="engines_f_precision").value == "(any)", "fp16 is no option: no engine has it"
    assert at.selectbox(key="engines_f_model").value == seeded.model_id
    at = _url_view("engines", status="READY", q="conv")
    at.run()
    assert at.selectbox(key="engines_f_status").value == "READY"
    assert frame(at, "id", "sha256")["id"].tolist() == [seeded.engine_id]


def test_overview_lists_a_failed_build_once_with_its_whole_reason(seeded: Seeded) -> None:
    reason = "the builder refused layer conv: " + ("no kernel for this shape " * 20).strip()
    with seeded.app.catalog.write() as session:
        job, _ = add_failed_build(session, seeded.model_id, reason, "e" * 64)
    at = view("overview").run()
    assert not at.exception
    heads = [plain(m.value) for m in at.markdown if " · " in m.value]
    assert sum(f"(job {job.id})" in h for h in heads) == 1 and not any(f"**job {job.id}**" in h for h in heads)
    assert [t.value for t in at.text].count(reason) == 1, "the whole reason, once"
    seeded_job = next(h for h in heads if f"**job {seeded.failed_job_id}**" in h)
    assert "convnet" in seeded_job and "model " not in seeded_job, "named, not numbered"


def test_listing_tables_are_sized_to_their_rows_not_a_ten_row_box(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engines, Models and Audit give their table the height of its rows (a page of engines is at
    most 50), instead of Streamlit's default box of ten rows with a scroll bar inside the page."""
    import streamlit

    heights: dict[str, object] = {}
    real = streamlit.dataframe

    def recording(data: object, *args: object, **kwargs: object) -> object:
        heights[str(kwargs.get("key"))] = kwargs.get("height", "auto")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(streamlit, "dataframe", recording)
    for name in ("engines", "models", "audit"):
        at = view(name).run()
        assert not at.exception, at.exception
    assert {k: heights.get(k) for k in ("engines_table", "models_table", "audit_table")} == dict.fromkeys(
        ("engines_table", "models_table", "audit_table"), "content"
    )


def test_status_tables_are_coloured_by_status(seeded: Seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    """Overview's status tables (markdown badges) and the Engines table (a Styler) colour each status;
    the word stays in the cell."""
    import pandas as pd
    import streamlit

    from enginecache.dashboard.statuscolours import STATUS_COLOURS
    from enginecache.dashboard.views import overview

    styled: dict[str, dict[str, str]] = {}
    real = streamlit.dataframe

    def recording(data: object, *args: object, **kwargs: object) -> object:
        if isinstance(data, pd.io.formats.style.Styler):
            data._compute()
            frame = data.data
            styled[str(kwargs.get("key"))] = {
                str(frame.iloc[row]["status"]): "; ".join(f"{k}: {v}" for k, v in css)
                for (row, _col), css in data.ctx.items()
            }
        return real(data, *args, **kwargs)

    monkeypatch.setattr(streamlit, "dataframe", recording)
    at = view("engines").run()
    assert not at.exception, at.exception
    assert styled.get("engines_table"), "the Engines table is not coloured"
    ready, _ink = STATUS_COLOURS["READY"]
    assert ready in styled["engines_table"]["READY"]

    at = view("overview").run()
    assert not at.exception, at.exception
    tables = [m.value for m in at.markdown if m.value.startswith(overview.STATUS_TABLE_HEAD)]
    badges = {status: colour for colour, status in re.findall(r"\| :(\w+)-badge\[(\w+)\] \|", tables[0])}
    assert set(badges) == {s.value for s in EngineStatus}, "every engine status, each a badge"
    assert badges["READY"] == "green" and badges["FAILED"] == "red" and badges["CORRUPT"] != badges["FAILED"]


def test_the_engine_page_says_its_models_version_and_the_aliases_pointing_at_it(seeded: Seeded) -> None:
    from enginecache.service.models.register import get_model
    from enginecache.service.models.releases import promote
    from tests.dashboardkit import engine_view, texts

    name = get_model(seeded.app, seeded.model_id).name
    before = texts(engine_view(seeded.engine_id).run())
    assert "version 1" in before and "aliases" not in before
    promote(seeded.app, name, "prod")
    promote(seeded.app, name, "canary", gpu_class="sm89")
    after = texts(engine_view(seeded.engine_id).run())
    assert "aliases canary for sm89, prod" in after, after


def test_filtering_engines_by_a_converted_variant_finds_the_engines_built_from_it(seeded: Seeded) -> None:
    variant = _variant(seeded)  # one fp16 engine built from it, filed under its source model
    with seeded.app.catalog.read() as session:
        built = session.exec(select(EngineRecord).where(EngineRecord.variant_model_id == variant.id)).all()
    at = _url_view("engines", model=str(variant.id))
    at.run()
    assert not at.exception, at.exception
    assert frame(at, "id", "sha256")["id"].tolist() == [e.id for e in built]
    source = _url_view("engines", model=str(seeded.model_id))
    source.run()
    assert set(frame(source, "id", "sha256")["id"]) >= {e.id for e in built}, "and under its source"
