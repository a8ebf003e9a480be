"""Models: upload an ONNX model (with external data, or a zip/tar of a model folder) or register
a path on the server; list models; inspect one (IO with dynamic dims, ops, opset, producer,
parameters, size, digest) and its lineage (source -> converted variants -> engines)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.express as px
import streamlit as st

from enginecache.core.shapetext import shape_text
from enginecache.dashboard import data
from enginecache.dashboard.uploads import UploadedFile, stage_upload
from enginecache.service.context import AppContext
from enginecache.service.models import RegisterResult, get_model, model_to_dict, register_model
from enginecache.service.readmodels.models import model_lineage

EXTRACT_LIMIT_ENV = "ENGINECACHE_MAX_EXTRACT_MB"


def upload_limit_mb() -> int:
    """Streamlit's own upload limit (server.maxUploadSize; `enginecache serve --max-upload-mb`)."""
    return int(st.get_option("server.maxUploadSize"))


def extract_limit_bytes() -> int:
    """What an archive may expand to: ENGINECACHE_MAX_EXTRACT_MB, default four times the upload limit."""
    mb = os.environ.get(EXTRACT_LIMIT_ENV)
    return int(mb) * 2**20 if mb else 4 * upload_limit_mb() * 2**20


def register_upload(
    app: AppContext, files: Sequence[UploadedFile], *, name: str | None, max_extract_bytes: int
) -> RegisterResult:
    """Stage the upload in a private temp folder, register its model, remove the folder.

    Bad input raises (InvalidModelError and its kin) before the store or catalog is touched."""
    with tempfile.TemporaryDirectory(prefix="enginecache-upload-") as tmp:
        model_file = stage_upload(files, Path(tmp) / "upload", max_extract_bytes=max_extract_bytes)
        return register_model(app, model_file, name=name or None)


def render() -> None:
    st.title("Models")
    app = data.get_app()
    key = data.catalog_key()
    _add_section(app)

    rows = data.model_rows(key)
    st.subheader(f"Models ({len(rows)})")
    if not rows:
        st.info("No models yet: upload an ONNX file above or register a path on the server.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "id": r.id,
                    "name": r.name,
                    "kind": "source" if r.parent_id is None else f"variant of {r.parent_id}",
                    "size": data.fmt_bytes(r.size_bytes),
                    "engines": r.engines,
                    "digest": r.digest[:16],
                    "created": r.created_at,
                }
                for r in rows
            ]
        ),
        hide_index=True,
        key="models_table",
    )
    ids = [r.id for r in rows]
    labels = {r.id: f"{r.name} (id {r.id})" for r in rows}
    wanted = st.session_state.get("models_selected_id")
    first_source = next((r.id for r in rows if r.parent_id is None), ids[0])
    index = ids.index(wanted) if wanted in ids else ids.index(first_source)
    chosen = st.selectbox("Model", ids, index=index, format_func=lambda i: labels[i], key="models_detail")
    _detail(app, int(chosen))


def _add_section(app: AppContext) -> None:
    limit = upload_limit_mb()
    with st.expander("Add a model", expanded=True):
        upload_tab, path_tab = st.tabs(["Upload", "Path on the server"])
        with upload_tab:
            st.caption(
                f"An `.onnx` file, with its external data files if it has any, or one `.zip`/`.tar` holding a "
                f"model folder. Upload limit: {limit} MB per file (server.maxUploadSize); an archive may "
                f"expand to {extract_limit_bytes() // 2**20} MB."
            )
            files = st.file_uploader("ONNX model", accept_multiple_files=True, key="models_upload")
            name = st.text_input("Name in the catalog (default: file name)", key="models_upload_name")
            if st.button("Register upload", key="models_upload_submit", disabled=not files):
                uploaded = [UploadedFile(f.name, f, f.size) for f in files or []]
                result = data.attempt(
                    "upload rejected",
                    register_upload,
                    app,
                    uploaded,
                    name=name.strip() or None,
                    max_extract_bytes=extract_limit_bytes(),
                )
                _registered(result)
        with path_tab:
            st.caption("A model file already on this server (external data beside it is included).")
            path = st.text_input("Path", key="models_path", placeholder="/data/models/resnet18.onnx")
            name2 = st.text_input("Name in the catalog (default: file name)", key="models_path_name")
            if st.button("Register path", key="models_path_submit", disabled=not path.strip()):
                result = data.attempt(
                    "cannot register", register_model, app, Path(path.strip()).expanduser(), name=name2.strip() or None
                )
                _registered(result)


def _registered(result: RegisterResult | None) -> None:
    if result is None:
        return
    data.clear_caches()
    model = result.model
    st.session_state["models_selected_id"] = model.id
    st.session_state["models_detail"] = model.id
    verb = "Registered" if result.created else "Already registered (same bytes)"
    st.success(f"{verb}: {model.name} (id {model.id}), sha256 {model.digest}")


def _io_frame(tensors: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "name": t["name"],
                "dtype": t["dtype"],
                "shape": shape_text(t["shape"]),
                "dynamic dims": ", ".join(str(d) for d in t["shape"] if not isinstance(d, int)) or "-",
            }
            for t in tensors
        ]
    )


def _detail(app: AppContext, model_id: int) -> None:
    model = data.attempt("cannot read the model", get_model, app, model_id)
    if model is None:
        return
    info = model_to_dict(model)
    st.subheader(f"{model.name} (id {model.id})")
    cols = st.columns(4)
    cols[0].metric("Size", data.fmt_bytes(model.size_bytes))
    cols[1].metric("Parameters", f"{info.get('parameter_count', 0):,d}")
    opsets = info.get("opsets") or {}
    cols[2].metric(
        "Opset", ", ".join(f"{d}:{v}" if d not in ("", "ai.onnx") else str(v) for d, v in opsets.items()) or "-"
    )
    cols[3].metric("IR version", info.get("ir_version", "-"))
    producer = f"{info.get('producer_name') or '-'} {info.get('producer_version') or ''}".strip()
    st.markdown(
        f"**producer** {producer}  \n**sha256** `{model.digest}`  \n"
        f"**file** `{model.filename}` stored at `{model.store_path}`"
    )
    if info.get("external_data_files"):
        st.markdown("**External data:** " + ", ".join(f"`{f}`" for f in info["external_data_files"]))
    if model.recipe:
        st.markdown("**Precision recipe**")
        st.json(model.recipe, expanded=False)

    left, right = st.columns(2)
    with left:
        st.markdown("**Inputs**")
        st.dataframe(_io_frame(info.get("inputs", [])), hide_index=True, key="models_inputs")
        st.markdown("**Outputs**")
        st.dataframe(_io_frame(info.get("outputs", [])), hide_index=True, key="models_outputs")
    with right:
        histogram = info.get("op_histogram") or {}
        st.markdown(f"**Operators** ({sum(histogram.values())} nodes, {len(histogram)} kinds)")
        if histogram:
            frame = pd.DataFrame(sorted(histogram.items(), key=lambda kv: -kv[1]), columns=["op", "count"])
            fig = px.bar(frame.head(30), x="count", y="op", orientation="h", height=max(250, 22 * min(len(frame), 30)))
            fig.update_layout(yaxis={"autorange": "reversed"}, margin={"l": 0, "r": 0, "t": 10, "b": 0})
            st.plotly_chart(fig, key="models_ops_chart")

    lineage = data.attempt("cannot read the lineage", model_lineage, app, model_id)
    if lineage is None:
        return
    st.markdown("**Lineage**")
    lines = [f"- source **{lineage.source.name}** (id {lineage.source.id}, `{lineage.source.digest[:16]}`)"]
    for variant in lineage.variants:
        recipe = variant.recipe or {}
        tool = recipe.get("tool") or recipe.get("converter") or ""
        lines.append(f"  - converted **{variant.name}** (id {variant.id}, `{variant.digest[:16]}`) {tool}".rstrip())
    st.markdown("\n".join(lines))
    if lineage.engines:
        names = {lineage.source.id: lineage.source.name, **{v.id: v.name for v in lineage.variants}}
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "built from": names.get(e.model_id, e.model_id),
                        "backend": e.backend,
                        "precision": e.precision,
                        "targets": e.targets,
                        "status": e.status,
                        "engines": e.count,
                        "newest engine": e.newest_id,
                    }
                    for e in lineage.engines
                ]
            ),
            hide_index=True,
            key="models_lineage",
        )
    else:
        st.caption("No engines built from this model yet (see Build).")
