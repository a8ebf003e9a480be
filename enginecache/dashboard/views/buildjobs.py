"""Build's job list: the recent jobs from the catalog (not this browser session's), filterable by
status and kind, newest first; a live section (`dashboard.live`) while any job is QUEUED or RUNNING.

Each card says what the job does by name (`build convnet · TensorRT-RTX fp16 sm89`), its state
as it is now and how long it has taken (`service.readmodels.jobprogress`, which the matrix reads
too): a running job's progress and phase with Cancel (a bar once its worker reported progress,
"starting" without one before); a queued job no live worker can run
as a warning naming what is missing, with Cancel; a finished one without a progress bar or its
last phase (a SUCCEEDED build links to its engine, a FAILED one gives its reason in one line
naming the model, the whole error behind Details). Names come from
uploaded files: shown as plain text (`markdown_literal`)."""

from __future__ import annotations

import streamlit as st

from enginecache.dashboard import data, errortext
from enginecache.dashboard.live import link, live_section
from enginecache.service.builds.submit import cancel_job
from enginecache.service.readmodels.display import markdown_literal
from enginecache.service.readmodels.jobprogress import job_progress
from enginecache.service.readmodels.jobs import JobView, active_job_count, recent_jobs
from enginecache.service.readmodels.statuses import JobStatus

SHOWN_CHOICES = (10, 20, 50)
KINDS = {"build": "builds", "test_load": "test-loads"}
FAILED = (JobStatus.FAILED, JobStatus.DEAD)


def jobs_section() -> None:
    """The Jobs subheader, the filters, and the live list."""
    st.subheader("Jobs")
    cols = st.columns([3, 2, 1])
    statuses = cols[0].multiselect(
        "Status", [s.value for s in JobStatus], key="build_jobs_status", placeholder="any status"
    )
    kinds = cols[1].multiselect(
        "Kind", list(KINDS), format_func=KINDS.__getitem__, key="build_jobs_kind", placeholder="any kind"
    )
    shown = int(cols[2].selectbox("Shown", SHOWN_CHOICES, key="build_jobs_shown"))
    app = data.get_app()
    live_section(_job_list, tuple(statuses), tuple(kinds), shown, active=active_job_count(app) > 0)


def _job_list(statuses: tuple[str, ...], kinds: tuple[str, ...], shown: int) -> bool:
    """The cards; returns whether any job in the catalog is still QUEUED or RUNNING."""
    app = data.get_app()
    jobs = recent_jobs(app, statuses=statuses, kinds=kinds, limit=shown)
    if not jobs:
        st.caption("No jobs match." if statuses or kinds else "No jobs yet: submit a build below.")
    for job in jobs:
        _job_card(job)
    return active_job_count(app) > 0


def job_title(view: JobView) -> str:
    """`job 28 · build convnet · TensorRT-RTX fp16 sm89`; never a None where a name is unknown."""
    job = view.job
    kind = "test-load" if job.kind == "test_load" else job.kind
    subject = view.model_name if view.model_name is not None else "a model no longer in the catalog"
    if view.engine_id is not None:
        subject = f"engine {view.engine_id} of {subject}"
    return " · ".join(part for part in (f"job {job.id}", f"{kind} {subject}", view.what) if part)


def _cancel(job_id: int) -> bool:
    """Cancel the job (the service checks the role); a refusal is shown with its reason."""
    return data.attempt(f"cannot cancel job {job_id}", cancel_job, data.get_app(), job_id) is not None


def _job_card(view: JobView) -> None:
    job = view.job
    title = markdown_literal(job_title(view))
    shown = job_progress(job)  # the words and fraction the matrix shows too
    with st.container(border=True, key=f"build_job_{job.id}"):
        head, button = st.columns([5, 1])
        if job.status == JobStatus.RUNNING and shown.fraction is not None:
            head.progress(shown.fraction, text=f"{title} · RUNNING · {markdown_literal(shown.words)}")
        elif job.status == JobStatus.RUNNING:  # nothing reported yet: no empty bar
            head.markdown(f"{title} · **RUNNING** · {markdown_literal(shown.words)}")
        elif job.status == JobStatus.QUEUED:
            head.markdown(f"{title} · **QUEUED**")
            if view.needs is not None:
                st.warning(markdown_literal(f"Waiting: {view.needs}."), icon=":material/warning:")
        elif job.status == JobStatus.SUCCEEDED:
            head.markdown(f"{title} · **SUCCEEDED**")
            if job.result_engine_id is not None:
                engine = link(f"engine {job.result_engine_id}", "engines", engine=job.result_engine_id)
                button.markdown(engine if job.kind == "test_load" else f"{engine} built")
        else:
            head.markdown(f"{title} · **{job.status}**")
        if shown.duration:
            waiting = " · waiting for a worker to claim it" if job.status == JobStatus.QUEUED and not view.needs else ""
            st.caption(markdown_literal(shown.duration) + waiting)
        if view.active:
            asked = job.cancel_requested
            clicked = button.button(
                "Cancelling…" if asked else "Cancel",
                key=f"build_cancel_{job.id}",
                disabled=asked or not data.may("cancel"),
            )
            if clicked and _cancel(job.id):
                data.clear_caches()
                st.rerun()
        if job.error and job.status in FAILED:
            _failure(view)
        elif job.error:
            st.caption(markdown_literal(job.error))
        if job.log_tail:
            with st.expander("log tail"):
                st.code(job.log_tail, language=None)


def _failure(view: JobView) -> None:
    """A failed job's error in one line naming the model and the cause (no server path); the whole
    error behind Details where the line leaves some of it out."""
    job = view.job
    app = data.get_app()
    text = errortext.without_server_paths(job.error or "", app.home, app.store.tmp_dir)
    line = errortext.one_line(text)
    model = f"{view.model_name}: " if view.model_name else ""
    st.error(markdown_literal(f"{job.status}: {model}{line}"), icon=":material/error:")
    if line != text.strip():
        with st.expander("Details"):
            st.code(text, language=None, wrap_lines=True)
