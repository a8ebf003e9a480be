"""`enginecache worker`, `jobs` and `job show | cancel`: the queue and the process that runs it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from enginecache.cli.common import JobIdArgument, JsonOption, OffsetOption, app_context, emit, emit_json, print_listing

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
    from enginecache.service.worker import WorkerConfig, default_worker_name, run_worker

    config = WorkerConfig(
        name=name or default_worker_name(),
        once=once,
        concurrency=max(1, concurrency),
        lease_seconds=lease_seconds,
        poll_seconds=poll_seconds,
    )
    count = run_worker(app_context(ctx), config)
    typer.echo(f"worker {config.name}: ran {count} job(s)", err=True)


def _job_line(r: dict[str, Any]) -> str:
    return (
        f"{r['id']:>5}  {r['kind']:<9} {r['status']:<10} {r['progress']:>5.0%} {r['attempts']}/{r['max_attempts']} "
        f"{r['worker'] or '-':<24} {r['phase'] or r['waiting'] or ''}"
    )


def jobs_list(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[
        int | None,
        typer.Option(min=1, metavar="N", help=f"At most this many, newest first (default {DEFAULT_JOBS_LIMIT})."),
    ] = None,
    offset: OffsetOption = None,
    as_json: JsonOption = False,
) -> None:
    """Jobs in the queue, newest first."""
    from enginecache.service.listing import stream_jobs

    listing = stream_jobs(app_context(ctx), status=status, limit=limit or DEFAULT_JOBS_LIMIT, offset=offset or 0)
    print_listing(listing, as_json, _job_line, "no jobs")


def job_show(ctx: typer.Context, job_id: JobIdArgument, as_json: JsonOption = False) -> None:
    """A job's status, attempts, progress, phase, worker, requirements, error and log tail."""
    from enginecache.service.listing import show_job

    emit_json(show_job(app_context(ctx), job_id))


def job_cancel(ctx: typer.Context, job_id: JobIdArgument, as_json: JsonOption = False) -> None:
    """Cancel a queued job (it never runs) or a running one (its process group is killed)."""
    from enginecache.service.jobs import cancel_job, job_to_dict

    app_ctx = app_context(ctx)
    job = cancel_job(app_ctx, job_id)
    data = job_to_dict(app_ctx, job)
    emit(data, as_json, f"job {job_id}: {job.status}" + (" (cancel requested)" if job.cancel_requested else ""))


def register(app: typer.Typer) -> None:
    """Add `worker`, `jobs` and the `job` group to the CLI."""
    app.command()(worker)
    app.command("jobs")(jobs_list)
    group = typer.Typer(help="Inspect and cancel jobs.", no_args_is_help=True)
    group.command("show")(job_show)
    group.command("cancel")(job_cancel)
    app.add_typer(group, name="job")
