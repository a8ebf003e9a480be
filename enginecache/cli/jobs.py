"""`enginecache worker`, `jobs` and `job show | cancel`: the queue and the process that runs it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from enginecache.cli.common import (
    JobIdArgument,
    JsonOption,
    OffsetOption,
    add_group,
    app_context,
    emit,
    inline,
    job_error,
    limit_option,
    print_listing,
    when,
)

DEFAULT_JOBS_LIMIT = 200


def worker(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option(help="Worker name (default host-pid).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Run until no job is claimable, then exit.")] = False,
    concurrency: Annotated[int, typer.Option(help="Jobs run at the same time.")] = 1,
    lease_seconds: Annotated[
        float,
        typer.Option(
            "--lease-seconds", envvar="ENGINECACHE_LEASE_SECONDS", help="Lease length; heartbeat every third."
        ),
    ] = 30.0,
    poll_seconds: Annotated[float, typer.Option("--poll-seconds", help="Idle poll interval.")] = 0.2,
) -> None:
    """Claim and run jobs this host can run, until stopped (SIGINT/SIGTERM: finish, then exit)."""
    from enginecache.service.jobs.worker import WorkerConfig, default_worker_name, run_worker

    config = WorkerConfig(
        name=name or default_worker_name(),
        once=once,
        concurrency=max(1, concurrency),
        lease_seconds=lease_seconds,
        poll_seconds=poll_seconds,
    )
    count = run_worker(app_context(ctx), config)
    typer.echo(f"worker {config.name}: ran {count} job(s)", err=True)


def _current_phase(r: dict[str, Any]) -> str | None:
    """The job's phase as every view words it (`service.readmodels.jobprogress.phase_words`)."""
    from enginecache.service.readmodels.jobprogress import phase_words

    return phase_words(str(r.get("status")), r.get("phase"))


def _job_line(r: dict[str, Any]) -> str:
    return (
        f"{r['id']:>5}  {r['kind']:<9} {r['status']:<10} {r['progress']:>5.0%} {r['attempts']}/{r['max_attempts']} "
        f"{r['worker'] or '-':<24} {_current_phase(r) or r['waiting'] or ''}"
    )


def jobs_list(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int | None, limit_option(DEFAULT_JOBS_LIMIT)] = None,
    offset: OffsetOption = None,
    as_json: JsonOption = False,
) -> None:
    """Jobs in the queue, newest first."""
    from enginecache.service.readmodels.listing import stream_jobs

    listing = stream_jobs(app_context(ctx), status=status, limit=limit or DEFAULT_JOBS_LIMIT, offset=offset or 0)
    print_listing(listing, as_json, _job_line, "no jobs")


def job_show(ctx: typer.Context, job_id: JobIdArgument, as_json: JsonOption = False) -> None:
    """A job's status, attempts, progress, phase, worker, requirements, error and log tail."""
    from enginecache.service.readmodels.listing import show_job

    data = show_job(app_context(ctx), job_id)
    emit(data, as_json, _job_text(data))


def _job_text(data: dict[str, Any]) -> str:
    """`job show` for people: status, attempts, progress, the engine it made, phase (while unfinished),
    worker, what it needs and was asked for, times, what it waits for, the error and the log tail;
    --json has every field. Text from the catalog is shown with its control characters escaped (no
    forged lines)."""
    from enginecache.service.readmodels.display import printable

    engine = f", engine {data['result_engine_id']}" if data.get("result_engine_id") is not None else ""
    phase = _current_phase(data)
    lines = [
        f"job {data['id']}: {data['kind']} {data['status']}, attempt {data['attempts']} of {data['max_attempts']}, "
        f"{data['progress']:.0%}{engine}",
        f"phase: {printable(str(phase))}" if phase else "",
        f"worker: {printable(str(data['worker']))}" if data.get("worker") else "",
        f"waiting: {printable(str(data['waiting']))}" if data.get("waiting") else "",
        "cancel requested" if data.get("cancel_requested") else "",
        f"needs: {printable(inline(data.get('requirements') or {}))}",
        f"request: {printable(inline(data.get('payload') or {}))}",
        f"times (UTC): created {when(data.get('created_at'))}, started {when(data.get('started_at'))}, "
        f"finished {when(data.get('finished_at'))}",
        f"failure: {printable(job_error(data['error'], data.get('result_engine_id')))}" if data.get("error") else "",
    ]
    tail = str(data.get("log_tail") or "").rstrip("\n")
    if tail:
        lines.append("log tail:")
        lines.extend(f"  {printable(line)}" for line in tail.split("\n"))  # any other control escaped
    return "\n".join(line for line in lines if line)


def job_cancel(ctx: typer.Context, job_id: JobIdArgument, as_json: JsonOption = False) -> None:
    """Cancel a queued job (it never runs) or a running one (its process group is killed)."""
    from enginecache.service.builds.submit import cancel_job, job_to_dict

    app_ctx = app_context(ctx)
    job = cancel_job(app_ctx, job_id)
    data = job_to_dict(app_ctx, job)
    emit(data, as_json, f"job {job_id}: {job.status}" + (" (cancel requested)" if job.cancel_requested else ""))


def register(app: typer.Typer) -> None:
    """Add `worker`, `jobs` and the `job` group to the CLI."""
    app.command()(worker)
    app.command("jobs")(jobs_list)
    add_group(app, "job", "Inspect and cancel jobs.", {"show": job_show, "cancel": job_cancel})
