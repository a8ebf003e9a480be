"""The `enginecache serve` command: dashboard plus one local worker (see service.access.serve)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from enginecache.cli.common import app_context, note_line

if TYPE_CHECKING:
    from enginecache.service.access.serve import Served

# enginecache.service.access.serve's defaults, written out so that `--help` imports no service code
# (tests/test_cli_listing.py checks they agree).
DEFAULT_PORT = 8501
DEFAULT_MAX_UPLOAD_MB = 2048


def register(app: typer.Typer) -> None:
    """Add `serve` to the CLI."""

    @app.command()
    def serve(
        ctx: typer.Context,
        port: Annotated[int, typer.Option("--port", "-p", help="Dashboard port.")] = DEFAULT_PORT,
        address: Annotated[
            str | None,
            typer.Option(
                "--address",
                envvar="ENGINECACHE_ADDRESS",
                # no square brackets: the rich help reads them as markup and drops them
                help="Address to listen on (default 127.0.0.1, or --login-address where a login is configured; "
                "another address needs a login configured in the auth section of .streamlit/secrets.toml, "
                "or --insecure-no-auth).",
            ),
        ] = None,
        insecure_no_auth: Annotated[
            bool,
            typer.Option(
                "--insecure-no-auth",
                envvar="ENGINECACHE_INSECURE_NO_AUTH",
                help="Listen on a non-loopback address with no login (warned about).",
            ),
        ] = False,
        login_address: Annotated[
            str | None,
            typer.Option(
                "--login-address",
                envvar="ENGINECACHE_LOGIN_ADDRESS",
                help="Address to listen on when a login is configured and no --address is given "
                "(the Docker image sets 0.0.0.0); with no login it is ignored.",
            ),
        ] = None,
        max_upload_mb: Annotated[
            int, typer.Option("--max-upload-mb", help="Largest file the dashboard accepts, in MB.")
        ] = DEFAULT_MAX_UPLOAD_MB,
        worker: Annotated[
            bool, typer.Option("--worker/--no-worker", help="Start one local worker beside the dashboard.")
        ] = True,
        worker_name: Annotated[str | None, typer.Option("--worker-name", help="Name of the local worker.")] = None,
    ) -> None:
        """Start the dashboard and one local worker on this catalog; ^C stops both."""
        from enginecache.service.access.auditverify import report_trigger_problems
        from enginecache.service.access.exposure import (
            LOGIN_REQUIRED_ENV,
            decide_exposure,
            streamlit_login_configured,
        )
        from enginecache.service.access.serve import ServeSpec, run_serve

        login = streamlit_login_configured(os.environ)
        exposure = decide_exposure(
            address, login=login.configured, insecure_no_auth=insecure_no_auth, login_address=login_address
        )
        note_line(exposure.note)
        app_ctx = app_context(ctx)
        app_ctx.catalog  # noqa: B018 - migrate once here, before two processes open the catalog
        report_trigger_problems(app_ctx)  # a missing or disabled append-only trigger: an error logged
        spec = ServeSpec(
            home=app_ctx.home,
            db_url=app_ctx.db_url,
            port=port,
            address=exposure.address,
            max_upload_mb=max_upload_mb,
            worker=worker,
            worker_name=worker_name,
            extra_env={LOGIN_REQUIRED_ENV: "1"} if exposure.login_required else {},
        )

        def ready(served: Served) -> None:
            where = f"catalog {app_ctx.catalog.safe_url}, store {app_ctx.home}"
            note_line(f"enginecache dashboard: {served.url} ({where})")
            typer.echo("worker: " + ("running" if served.worker else "none (--no-worker)"), err=True)

        code = run_serve(spec, on_ready=ready)
        if code:
            raise typer.Exit(code)
