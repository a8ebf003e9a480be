"""The `enginecache` command line (Typer): the root app, its options, and the entry point.

Each command module registers its commands through `register(app)`; none imports this module.
Read commands print JSON with `--json`. Exit codes: 0 ok, 1 failed or corrupt, 2 bad input,
3 the catalog or the store is unavailable (see enginecache.errors).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import click
import typer

from enginecache.cli import builds, engines, host, jobs, models, runtime, serve
from enginecache.errors import EngineCacheError, exit_code_for
from enginecache.service.context import AppContext

EXIT_INTERRUPTED = 130

app = typer.Typer(
    name="enginecache", help="Build TensorRT engines once, load them in milliseconds.", no_args_is_help=True
)


@app.callback()
def main_callback(
    ctx: typer.Context,
    home: Annotated[
        Path | None, typer.Option("--home", help="Store directory (env ENGINECACHE_HOME, default ./engines).")
    ] = None,
    db: Annotated[
        str | None, typer.Option("--db", help="Catalog URL (env ENGINECACHE_DB_URL, default SQLite in HOME).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    ctx.obj = AppContext.from_settings(home, db)
    ctx.call_on_close(ctx.obj.close)


for _module in (host, models, engines, builds, jobs, runtime, serve):
    _module.register(app)


def main() -> None:
    """Entry point: map typed errors to a message and their kind's exit code, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except EngineCacheError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(exit_code_for(err))
    except click.ClickException as err:  # usage errors
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
