"""The Engines view's import form (operator role): an engine built elsewhere, with what it was built
from and for, handed to `service.engines.bundles.import_engine_or_bundle` as `engine import PATH`
does (the same checks, the same `engine.import` audit row). It takes

- an uploaded engine file (a TensorRT plan, an ORT model);
- an uploaded `.zip`/`.tar`/`.tar.gz`/... of an engine bundle's folder (TensorRT-LLM's `config.json`
  and `rank<N>.engine` files, any others beside them), extracted safely by `dashboard.archives`
  (the Models view's rules and limits: no links, no `..`, the entry, size and ratio limits) into a
  staging folder on the store's filesystem (`tmp/upload-*/upload/`, as the Models view's uploads),
  removed afterwards. The archive holds the folder's files
  at its top, or one folder holding them (`zip -r llm.zip llm/`);
- for admins, where `ENGINECACHE_IMPORT_ROOTS` names folders (the Models view's "Path on the
  server", `views.models.import_roots`), a path on this server: an engine file or a bundle folder
  under those roots, resolved with `os.path.realpath` (a symlink out of a root is refused, and a
  bundle with a symlink inside is refused by the bundle's own checks). Anything else, missing or
  outside alike, gets one message that says nothing of what is there.

A refusal (a header that contradicts the declaration, bytes that are no engine of the backend, a
folder that is no bundle, an unsafe archive) is shown with its reason in one line, without the
staging folder's path (`views.models.error_lines`), the whole error behind Details, and nothing is
stored; an import opens the new engine, UNPROVEN.

Drawn at the bottom of the view, so the engine page's own uploader (test-load inputs) comes first."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import streamlit as st

from enginecache.dashboard import data
from enginecache.dashboard.archives import ARCHIVE_SUFFIXES, extract_archive, is_archive
from enginecache.dashboard.staging import UploadedFile
from enginecache.dashboard.urlstate import to_url
from enginecache.errors import EngineCacheError
from enginecache.service.access import roles as access
from enginecache.service.builds.views import PRECISIONS, backend_choices
from enginecache.service.context import AppContext
from enginecache.service.engines.bundles import import_engine_or_bundle
from enginecache.service.engines.importing import ImportRequest, ImportResult
from enginecache.service.readmodels.display import markdown_literal

logger = logging.getLogger(__name__)

IMPORTED = "engines_import_result"  # st.session_state: the line the last import left
NOT_IMPORTABLE = "not an engine file or bundle folder under the import roots"


def import_form(app: AppContext) -> None:
    """The form, where this run's role may import; the last import's outcome above it."""
    if not data.may("import"):
        return
    roots = _server_roots()
    done = st.session_state.pop(IMPORTED, None)
    with st.expander("Import an engine built elsewhere", expanded=done is not None):
        if done is not None:
            st.success(markdown_literal(done))
        st.caption(
            "An engine your CI built (trtexec, a build script, trtllm-build): checked against its own header, "
            "stored and hashed, UNPROVEN until a host that can run it test-loads it. Lookups pass it by until then. "
            f"An engine bundle (config.json, rank0.engine, rank1.engine, ... and any files beside them) is "
            f"uploaded as one archive of its folder ({', '.join(ARCHIVE_SUFFIXES)})."
        )
        upload = st.file_uploader("Engine file, or an archive of a bundle folder", key="engines_import_file")
        server_path = ""
        if roots:
            shown = ", ".join(markdown_literal(str(r)) for r in roots)
            server_path = st.text_input(
                f"Or a path on this server: an engine file or a bundle folder under {shown}",
                key="engines_import_path",
            ).strip()
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
        given = upload is not None or bool(server_path)
        clicked = st.button("Import", key="engines_import_submit", disabled=not given or not model.strip())
    if not clicked or not given:
        return
    if upload is not None and server_path:
        st.error("Give an upload or a path on the server, not both.")
        return
    request = ImportRequest(
        path=Path("."),
        model=model.strip(),
        backend=str(backend),
        precision=str(precision),
        targets=tuple(t for t in targets.replace(" ", ",").split(",") if t),
        backend_version=version.strip() or None,
        profiles=tuple(p.strip() for p in profiles.split(";") if p.strip()),
        notes=notes.strip(),
    )
    if upload is not None:
        shown_name = str(upload.name)
        result = _attempt(app, import_upload, request, UploadedFile(shown_name, upload, upload.size))
    else:
        shown_name = server_path
        result = _attempt(app, import_server_path, request, server_path, roots)
    if result is None:
        return
    st.session_state[IMPORTED] = (
        f"{shown_name}: engine {result.engine_id} ({'already stored, ' if result.already else ''}{result.status})"
        + (", a bundle" if result.provenance.get("bundle") else "")
    )
    st.session_state.pop("engines_detail", None)
    to_url("engine", result.engine_id)
    data.clear_caches()
    st.rerun()


def _attempt(app: AppContext, fn: Callable[..., ImportResult], *args: Any) -> ImportResult | None:
    """`fn(app, *args)`; a failure shown as the Models view shows one (`views.models.error_lines`:
    one line, no server path, the whole error behind Details), None then."""
    try:
        return fn(app, *args)
    except Exception as err:  # every failure is shown to the operator with its reason
        from enginecache.dashboard.views.models import error_lines  # the one owner of an error's words

        if not isinstance(err, EngineCacheError | OSError | ValueError):
            logger.exception("dashboard error")
        line, details = error_lines("import refused", err, app)
        st.error(markdown_literal(line), icon=":material/error:")
        if details.split(": ", 1)[-1] != line.split(": ", 1)[-1]:
            with st.expander("Details"):
                st.code(details, language=None, wrap_lines=True)
        return None


def _server_roots() -> tuple[Path, ...]:
    """The import roots a path on the server may name, where this run's role may use one (admins,
    as for the Models view's "Path on the server"); () otherwise or where none is configured."""
    if not data.may("server_path"):
        return ()
    from enginecache.dashboard.views.models import import_roots  # the one reader of ENGINECACHE_IMPORT_ROOTS

    return import_roots()


def import_upload(app: AppContext, request: ImportRequest, upload: UploadedFile) -> ImportResult:
    """Import an uploaded engine file, or the bundle folder an uploaded archive holds (module
    docstring), from a scratch folder on the store's filesystem that is removed afterwards. Raises
    what `import_engine_or_bundle` raises, and UploadError for an archive `dashboard.archives`
    refuses; nothing is stored then."""
    access.require(app, "import")  # before anything is written or extracted
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(upload.name).name) or "engine.plan"
    with app.store.temp_dir("upload-") as work:
        staging = work / "upload"  # the path `views.models.error_lines` leaves out of what is shown
        if is_archive(upload.name):
            from enginecache.dashboard.views.models import extract_limit_bytes  # the one owner of the limit

            extract_archive(upload, staging, max_extract_bytes=extract_limit_bytes())
            path = bundle_folder(staging)
        else:
            staging.mkdir()
            path = staging / name
            with open(path, "xb") as out:
                while chunk := upload.stream.read(1 << 20):
                    out.write(chunk)
        return import_engine_or_bundle(app, replace(request, path=path, source=f"dashboard upload {name}"))


def bundle_folder(extracted: Path) -> Path:
    """The bundle's folder in an extracted archive: `extracted` itself where its files lie at the top,
    or the one folder it holds (an archive of the folder itself); the bundle's own checks
    (`core.enginebundle.scan_folder`) say what is wrong with anything else."""
    entries = list(extracted.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return extracted


def importable_engine_path(text: str, roots: Sequence[Path]) -> Path:
    """`views.models.path_under_roots` (the one check of a server path) for a file or a folder."""
    from enginecache.dashboard.views.models import path_under_roots  # imported where used: it loads plotly

    return path_under_roots(text, roots, lambda path: path.is_file() or path.is_dir(), refusal=NOT_IMPORTABLE)


def import_server_path(app: AppContext, request: ImportRequest, text: str, roots: Sequence[Path]) -> ImportResult:
    """Import the engine file or bundle folder at `text` on this server, which must lie inside
    `roots` (admins only: `server_path`, as the Models view's; the import itself checks `import`)."""
    access.require(app, "server_path")
    real = importable_engine_path(os.path.expanduser(text), roots)
    source = f"dashboard server path {socket.gethostname()}:{real}"
    return import_engine_or_bundle(app, replace(request, path=real, source=source))
