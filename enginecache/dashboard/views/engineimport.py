"""The Engines view's import form (operator role): an engine file built elsewhere, uploaded with what
it was built from and for, handed to `service.engines.importing.import_engine` as `engine import`
does. A refusal (a header that contradicts the declaration, bytes that are no engine of the backend)
is shown with its reason and nothing is stored; an import opens the new engine, UNPROVEN.

Drawn at the bottom of the view, so the engine page's own uploader (test-load inputs) comes first."""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path

import streamlit as st

from enginecache.dashboard import data
from enginecache.dashboard.urlstate import to_url
from enginecache.service.builds.views import PRECISIONS, backend_choices
from enginecache.service.context import AppContext
from enginecache.service.engines.importing import ImportRequest, ImportResult, import_engine
from enginecache.service.readmodels.display import markdown_literal

IMPORTED = "engines_import_result"  # st.session_state: the line the last import left


def import_form(app: AppContext) -> None:
    """The form, where this run's role may import; the last import's outcome above it."""
    if not data.may("import"):
        return
    done = st.session_state.pop(IMPORTED, None)
    with st.expander("Import an engine built elsewhere", expanded=done is not None):
        if done is not None:
            st.success(markdown_literal(done))
        st.caption(
            "An engine your CI built (trtexec, a build script): checked against its own header, stored and "
            "hashed, UNPROVEN until a host that can run it test-loads it. Lookups pass it by until then."
        )
        upload = st.file_uploader("Engine file", key="engines_import_file")
        model = st.text_input("Model (NAME, NAME@vN, NAME@ALIAS or id)", key="engines_import_model")
        backends = {b.name: b.label for b in backend_choices()}
        cols = st.columns(3)
        backend = cols[0].selectbox(
            "Backend", list(backends), format_func=backends.__getitem__, key="engines_import_backend"
        )
        precision = cols[1].selectbox("Precision", PRECISIONS, key="engines_import_precision")
        targets = cols[2].text_input("Targets (sm86,sm89; empty: the header's)", key="engines_import_targets")
        version = st.text_input("Library version it was built with (optional)", key="engines_import_version")
        profiles = st.text_input("Profiles, INPUT=MIN,OPT,MAX; ... (optional)", key="engines_import_profiles")
        notes = st.text_area("Notes (optional)", key="engines_import_notes")
        clicked = st.button("Import", key="engines_import_submit", disabled=upload is None or not model.strip())
    if not clicked or upload is None:
        return
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(str(upload.name)).name) or "engine.plan"
    request = ImportRequest(
        path=Path(name),
        model=model.strip(),
        backend=str(backend),
        precision=str(precision),
        targets=tuple(t for t in targets.replace(" ", ",").split(",") if t),
        backend_version=version.strip() or None,
        profiles=tuple(p.strip() for p in profiles.split(";") if p.strip()),
        notes=notes.strip(),
        source=f"dashboard upload {name}",
    )
    result = _import_upload(app, request, upload.getvalue())
    if result is None:
        return
    st.session_state[IMPORTED] = (
        f"{upload.name}: engine {result.engine_id} ({'already stored, ' if result.already else ''}{result.status})"
    )
    st.session_state.pop("engines_detail", None)
    to_url("engine", result.engine_id)
    data.clear_caches()
    st.rerun()


def _import_upload(app: AppContext, request: ImportRequest, content: bytes) -> ImportResult | None:
    """The upload on disk under its own name while it is imported (the import copies it into the store)."""
    with tempfile.TemporaryDirectory(prefix="enginecache-import-") as tmp:
        path = Path(tmp) / request.path.name
        path.write_bytes(content)
        return data.attempt("import refused", import_engine, app, replace(request, path=path))
