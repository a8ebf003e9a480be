"""Models: upload an ONNX model (with external data, or a zip/tar of a model folder) or register
a path on the server; list models; inspect one (IO with dynamic dims, ops, opset, producer,
parameters, size, digest) and its lineage (source -> converted variants -> engines).

"Path on the server" registers a file already on this server, and only one under the folders
ENGINECACHE_IMPORT_ROOTS names (`os.pathsep`-separated absolute paths); without it the form is not
shown. The path given is resolved (`os.path.realpath`: a symlink out of a root is refused) and must be
a regular `.onnx` file inside a root; anything else, missing or not allowed alike, gets one message
("not an ONNX file under the import roots") that says nothing of what is there, and no error shown
here quotes a file's bytes. Only admins see the form (and `register_server_path` checks the role
again); operators see the upload, viewers neither.

Names, producers, file names and every error message (which may quote them) come from uploaded
files: they are shown as plain text (`service.readmodels.display.markdown_literal` inside Markdown), so a
producer named ``![x](http://evil/i.png)`` shows those characters and no image is fetched.
"""

from __future__ import annotations

import html
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import plotly.express as px
import streamlit as st

from enginecache.dashboard import data, errortext
from enginecache.dashboard.uploads import UploadedFile, remove_tree, stage_upload
from enginecache.dashboard.urlstate import from_url, to_url, url_int
from enginecache.dashboard.views.releases import release_panel
from enginecache.errors import BadInputError, EngineCacheError, ModelNameTakenError, StoreError, UnavailableError
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.models.detail import model_detail
from enginecache.service.models.register import RegisterResult, default_model_name, register_model
from enginecache.service.models.releases import versions
from enginecache.service.readmodels.display import markdown_literal, shape_text
from enginecache.service.readmodels.models import grouped, model_lineage

logger = logging.getLogger(__name__)

T = TypeVar("T")

EXTRACT_LIMIT_ENV = "ENGINECACHE_MAX_EXTRACT_MB"
IMPORT_ROOTS_ENV = "ENGINECACHE_IMPORT_ROOTS"
NOT_IMPORTABLE = "not an ONNX file under the import roots"
SERVER_PATH_TAB = "Path on the server"  # the server-path form's tab: admins only
NEW_VERSION_LABEL = "Register as a new version of {name}"  # shown where the upload's name is taken


def upload_limit_mb() -> int:
    """Streamlit's own upload limit (server.maxUploadSize; `enginecache serve --max-upload-mb`)."""
    return int(st.get_option("server.maxUploadSize"))


def extract_limit_bytes() -> int:
    """What an archive may expand to: ENGINECACHE_MAX_EXTRACT_MB, default four times the upload limit."""
    mb = os.environ.get(EXTRACT_LIMIT_ENV)
    return int(mb) * 2**20 if mb else 4 * upload_limit_mb() * 2**20


def register_upload(
    app: AppContext,
    files: Sequence[UploadedFile],
    *,
    name: str | None,
    max_extract_bytes: int,
    new_version: bool = False,
) -> RegisterResult:
    """Stage the upload in a private folder under the store's tmp/ (its filesystem, not /tmp's),
    register its model (as the newest version of `name` where `new_version`, as `model add
    --new-version` does), remove the folder.

    Bad input raises (InvalidModelError and its kin) before the store or catalog is touched; a disk
    full or failing while the upload is written raises StoreError, with nothing of it left."""
    try:
        app.store.ensure()
        staging = Path(tempfile.mkdtemp(prefix="upload-", dir=app.store.tmp_dir))
    except OSError as err:
        raise StoreError(f"could not make a folder for the upload in {app.store.tmp_dir}: {err.strerror}") from err
    try:
        model_file = stage_upload(files, staging / "upload", max_extract_bytes=max_extract_bytes)
        return register_model(app, model_file, name=name or None, new_version=new_version)
    finally:
        remove_tree(staging)


def import_roots() -> tuple[Path, ...]:
    """The folders "Path on the server" may register from: ENGINECACHE_IMPORT_ROOTS, resolved
    (`os.path.realpath`); entries that are not absolute paths are left out. Empty: the form is off."""
    entries = (e.strip() for e in os.environ.get(IMPORT_ROOTS_ENV, "").split(os.pathsep))
    return tuple(Path(os.path.realpath(e)) for e in entries if e and os.path.isabs(e))


def path_under_roots(
    text: str, roots: Sequence[Path], accept: Callable[[Path], bool], *, refusal: str = NOT_IMPORTABLE
) -> Path:
    """The real path of absolute `text` where it lies inside one of `roots` and `accept`s, else
    BadInputError saying `refusal` for every case (missing, outside, a symlink out, not accepted),
    so the answer tells nothing about the file system beyond the roots."""
    refused = BadInputError(f"{text!r}: {refusal} ({os.pathsep.join(str(r) for r in roots)})")
    if not text or "\x00" in text or not os.path.isabs(text):
        raise refused
    real = Path(os.path.realpath(text))
    if not any(real.is_relative_to(root) for root in roots) or not accept(real):
        raise refused
    return real


def importable_path(text: str, roots: Sequence[Path]) -> Path:
    """`path_under_roots` for a regular `.onnx` file."""
    return path_under_roots(text, roots, lambda path: path.suffix.lower() == ".onnx" and path.is_file())


def register_server_path(app: AppContext, text: str, *, name: str | None, roots: Sequence[Path]) -> RegisterResult:
    """Register the `.onnx` file at `text` on this server, which must be inside `roots` (admins only)."""
    access.require(app, "server_path")
    return register_model(app, importable_path(text, roots), name=name or None)


def without_server_paths(text: str, app: AppContext) -> str:
    """`errortext.without_server_paths` for this app's home and store."""
    return errortext.without_server_paths(text, app.home, app.store.tmp_dir)


def error_lines(what: str, err: BaseException, app: AppContext) -> tuple[str, str]:
    """(the one line shown: `what` and the cause, no server path, no library's own text; the
    details for the expander: the error's type and its whole text, server paths left out)."""
    text = without_server_paths(str(err), app)
    if isinstance(err, ModelNameTakenError):  # the service's words name the CLI's flags
        line = (
            f'{what}: the name {err.name} is taken by other bytes: tick "{NEW_VERSION_LABEL.format(name=err.name)}" '
            "(type the name first where it is not shown) to register these bytes as its new version, or type "
            "another name"
        )
    elif isinstance(err, UnavailableError):
        line = f"the store or the catalog is unavailable, try again later: {text}"
    elif isinstance(err, EngineCacheError | OSError | ValueError):
        line = f"{what}: {errortext.one_line(text)}"
    else:
        line = f"{what}: {type(err).__name__}: {errortext.one_line(text)}"
    return line, f"{type(err).__name__}: {text}"


def _attempt(what: str, fn: Callable[..., T], *args: Any, app: AppContext, **kwargs: Any) -> T | None:
    """`data.attempt` for this view: one line naming what failed and why, as plain text (it may
    quote a user's names), with no server path; the whole error behind Details."""
    try:
        return fn(app, *args, **kwargs)
    except Exception as err:  # every failure is shown to the operator with its reason
        if not isinstance(err, EngineCacheError | OSError | ValueError):
            logger.exception("dashboard error")
        line, details = error_lines(what, err, app)
        st.error(markdown_literal(line), icon=":material/error:")
        if details.split(": ", 1)[-1] != line.split(": ", 1)[-1]:
            with st.expander("Details"):
                st.code(details, language=None, wrap_lines=True)
        return None


def _count_heading(rows: Sequence[Any]) -> str:
    """`Models (5, and 2 converted variants)`: source models counted as Overview counts them, the
    variants the table lists under them apart."""
    variants = sum(1 for r in rows if r.parent_id is not None)
    sources = len(rows) - variants
    return f"Models ({sources}" + (f", and {variants} converted variant(s))" if variants else ")")


def render() -> None:
    st.title("Models")
    app = data.get_app()
    key = data.catalog_key()
    if data.may("upload"):
        _add_section(app, server_path=data.may("server_path"))

    search = ""
    every = data.model_rows(key)
    if every:  # nothing to search in an empty catalog
        from_url("models_search", "q")
        search = st.text_input("Search", key="models_search", placeholder="model name, or a digest prefix").strip()
        to_url("q", search)
    rows = grouped(data.model_rows(key, search) if search else every)  # one query where nothing is searched
    st.subheader(_count_heading(rows))
    if not rows:
        if search:
            st.info("No model's name contains that, and no digest starts with it.")
        else:
            st.info(
                "No models yet: upload an ONNX file above or register a path on the server."
                if data.may("upload")
                else "No models yet."
            )
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "name": r.name if r.parent_id is None else f"  ↳ {r.name}",  # a dataframe cell is plain text
                    "version": "-" if r.version is None else str(r.version),  # a variant has none
                    "kind": "source" if r.parent_id is None else f"variant of {r.parent_name or r.parent_id}",
                    "engines": r.engines,
                    "with variants": str(r.family_engines) if r.parent_id is None else "-",
                    "size": data.fmt_bytes(r.size_bytes),
                    "digest": r.digest[:16],
                    "created": r.created_at,
                    "id": r.id,
                }
                for r in rows
            ]
        ),
        hide_index=True,
        height="content",  # every model shown, no box of ten rows to scroll inside
        key="models_table",
        column_config={
            "engines": st.column_config.NumberColumn(help="engines built from this very file"),
            "with variants": st.column_config.TextColumn(
                help="a source model's engines and its converted variants': the sum of the rows under it"
            ),
        },
    )
    ids = [r.id for r in rows]
    labels = {r.id: r.label for r in rows}  # two versions of a name under one label were one option
    from_url("models_detail", "model", url_int, ids)
    wanted = st.session_state.get("models_selected_id")
    first_source = next((r.id for r in rows if r.parent_id is None), ids[0])
    index = ids.index(wanted) if wanted in ids else ids.index(first_source)
    if st.session_state.get("models_detail") not in ids:
        st.session_state.pop("models_detail", None)  # searched away
    chosen = st.selectbox("Model", ids, index=index, format_func=lambda i: labels[i], key="models_detail")
    to_url("model", chosen)
    _detail(app, int(chosen))


def _add_section(app: AppContext, *, server_path: bool) -> None:
    """Upload (operators and admins) and, for admins, "Path on the server"."""
    limit = upload_limit_mb()
    with st.container(border=True):  # always open, so no browser-side state can hide the form
        st.markdown("**Add a model**")
        tabs = st.tabs(["Upload", SERVER_PATH_TAB] if server_path else ["Upload"])
        with tabs[0]:
            st.caption(
                f"An `.onnx` file, with its external data files if it has any, or one `.zip`/`.tar` holding a "
                f"model folder. Upload limit: {limit} MB per file (server.maxUploadSize); an archive may "
                f"expand to {extract_limit_bytes() // 2**20} MB."
            )
            files = st.file_uploader("ONNX model", accept_multiple_files=True, key="models_upload")
            name = st.text_input("Name in the catalog (default: file name)", key="models_upload_name").strip()
            wanted = name or _file_name(files or [])
            new_version = _new_version_choice(app, wanted) if wanted else False
            if st.button("Register upload", key="models_upload_submit", disabled=not files):
                uploaded = [UploadedFile(f.name, f, f.size) for f in files or []]
                result = _attempt(
                    "upload rejected",
                    register_upload,
                    uploaded,
                    app=app,
                    name=wanted if new_version else name or None,
                    max_extract_bytes=extract_limit_bytes(),
                    new_version=new_version,
                )
                _registered(result)
        if server_path:
            _server_path_form(app, tabs[1])


def _file_name(files: Sequence[Any]) -> str | None:
    """The name an upload without a typed name gets, where one `.onnx` file says it (an archive's model
    file is known only once it is unpacked)."""
    onnx = [f.name for f in files if f.name.lower().endswith(".onnx")]
    return default_model_name(onnx[0]) if len(onnx) == 1 else None


def _new_version_choice(app: AppContext, name: str) -> bool:
    """Where source models hold `name`, the box that registers the upload as its next version (left
    unticked: nothing takes a name over unasked); False where the name is free."""
    held = _attempt("cannot read the versions", versions, name, app=app) or []
    if not held:
        return False
    return st.checkbox(
        NEW_VERSION_LABEL.format(name=name) + f" (v{len(held) + 1})",
        key="models_upload_new_version",
        help=f"{name} has {len(held)} version(s); new bytes under its name become the next one, audited "
        "(model.register, new_version). Aliases keep pointing where they point until you promote.",
    )


def _server_path_form(app: AppContext, tab: Any) -> None:
    with tab:
        roots = import_roots()
        if not roots:
            st.caption(
                "Registering a file already on this server is off. To allow it, start the dashboard with "
                f"`{IMPORT_ROOTS_ENV}` naming the folders it may register from (absolute paths, "
                f"separated by `{os.pathsep}`)."
            )
        else:
            shown = ", ".join(markdown_literal(str(r)) for r in roots)
            st.caption(f"A model file already on this server, under {shown} (external data beside it is included).")
            path = st.text_input("Path", key="models_path", placeholder=str(roots[0] / "resnet18.onnx"))
            name2 = st.text_input("Name in the catalog (default: file name)", key="models_path_name")
            if st.button("Register path", key="models_path_submit", disabled=not path.strip()):
                result = _attempt(
                    "cannot register",
                    register_server_path,
                    os.path.expanduser(path.strip()),
                    app=app,
                    name=name2.strip() or None,
                    roots=roots,
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
    ids = [m.id for m in versions(data.get_app(), model.name)] if model.parent_id is None else []
    version = f" v{ids.index(model.id) + 1}" if model.id in ids else ""
    st.success(f"{verb}: {markdown_literal(model.name)}{version} (id {model.id}), sha256 {model.digest}")


def _io_frame(tensors: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "name": t["name"],  # a dataframe cell is plain text
                "dtype": t["dtype"],
                "shape": shape_text(t["shape"]),
                "dynamic dims": ", ".join(str(d) for d in t["shape"] if not isinstance(d, int)) or "-",
            }
            for t in tensors
        ]
    )


def _detail(app: AppContext, model_id: int) -> None:
    model = _attempt("cannot read the model", model_detail, model_id, app=app)
    if model is None:
        return
    info = model.info
    st.subheader(f"{markdown_literal(model.name)} (id {model.id})")
    cols = st.columns(4)
    cols[0].metric("Size", data.fmt_bytes(model.size_bytes))
    cols[1].metric("Parameters", f"{info.get('parameter_count', 0):,d}")
    opsets = info.get("opsets") or {}
    opset_text = ", ".join(f"{d}:{v}" if d not in ("", "ai.onnx") else str(v) for d, v in opsets.items())
    cols[2].metric("Opset", markdown_literal(opset_text) or "-")  # a metric's value is Markdown too
    cols[3].metric("IR version", info.get("ir_version", "-"))
    producer = f"{info.get('producer_name') or '-'} {info.get('producer_version') or ''}".strip()
    st.markdown(
        f"**producer** {markdown_literal(producer)}  \n**sha256** `{model.digest}`  \n"
        f"**file** {markdown_literal(model.filename)} stored at {markdown_literal(model.store_path)}"
    )
    if info.get("external_data_files"):
        st.markdown("**External data:** " + ", ".join(markdown_literal(str(f)) for f in info["external_data_files"]))
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
            # Plotly renders a subset of HTML in tick labels: op names (any string in a custom domain) escaped.
            ops = sorted(((html.escape(op), n) for op, n in histogram.items()), key=lambda kv: -kv[1])
            frame = pd.DataFrame(ops, columns=["op", "count"])
            fig = px.bar(frame.head(30), x="count", y="op", orientation="h", height=max(250, 22 * min(len(frame), 30)))
            fig.update_layout(yaxis={"autorange": "reversed"}, margin={"l": 0, "r": 0, "t": 10, "b": 0})
            st.plotly_chart(fig, key="models_ops_chart")

    if model.parent_id is None:  # a source model has versions and aliases; a converted variant has neither
        release_panel(app, model_id, model.name)
    lineage = _attempt("cannot read the lineage", model_lineage, model_id, app=app)
    if lineage is None:
        return
    st.markdown("**Lineage**")
    source = lineage.source
    lines = [f"- source **{markdown_literal(source.name)}** (id {source.id}, `{source.digest[:16]}`)"]
    for variant in lineage.variants:
        recipe = variant.recipe or {}
        tool = markdown_literal(str(recipe.get("tool") or recipe.get("converter") or ""))
        name = markdown_literal(variant.name)
        lines.append(f"  - converted **{name}** (id {variant.id}, `{variant.digest[:16]}`) {tool}".rstrip())
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
                        "open": f"engines?engine={e.newest_id}",
                    }
                    for e in lineage.engines
                ]
            ),
            hide_index=True,
            key="models_lineage",
            column_config={"open": st.column_config.LinkColumn("open", display_text="open engine")},
        )
    else:
        st.caption("No engines built from this model yet (see Build).")
