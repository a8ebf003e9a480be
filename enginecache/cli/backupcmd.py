"""`enginecache backup DEST` and `enginecache restore SRC`: the whole home, online (docs/backup.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import JsonOption, app_context, emit, note_line

PgBinOption = Annotated[
    Path | None,
    typer.Option("--pg-bin", metavar="DIR", help="Folder of pg_dump/pg_restore (default: PATH); PostgreSQL only."),
]


def _progress(as_json: bool) -> Any:
    if as_json:
        return None
    return lambda _phase, message: note_line(message)


def backup(
    ctx: typer.Context,
    dest: Annotated[Path, typer.Argument(help="A new (or empty) folder outside the home.")],
    pg_bin: PgBinOption = None,
    as_json: JsonOption = False,
) -> None:
    """Back up the catalog and every blob it references into DEST, online; a manifest lists each digest.

    SQLite: the online backup API; PostgreSQL: pg_dump of one snapshot, the blobs of that snapshot.
    Each blob is verified as it is copied; the folder appears at DEST only once complete.
    """
    from enginecache.service.maintenance.backup.usecases import backup as run_backup

    result = run_backup(app_context(ctx), dest, pg_bin=pg_bin, progress=_progress(as_json))
    data = result.to_dict()
    lines = [
        f"backup of {result.manifest['source']['catalog']} ({data['catalog']['kind']}, revision "
        f"{data['catalog']['alembic_revision']}) written to {result.dest}",
        f"{data['models']} models, {data['blobs']} blobs: {data['files']} files, {data['bytes']} bytes",
        *(
            f"left out: blob {s['sha256']} (engines {s['engine_ids']}, jobs {s['job_ids']}): {s['reason']}"
            for s in data["skipped"]["blobs"]
        ),
        *(f"left out: CORRUPT model {s['model_id']}: {s['reason']}" for s in data["skipped"]["models"]),
    ]
    emit(data, as_json, "\n".join(lines))


def restore(
    ctx: typer.Context,
    src: Annotated[Path, typer.Argument(help="A folder `enginecache backup` wrote.")],
    pg_bin: PgBinOption = None,
    as_json: JsonOption = False,
) -> None:
    """Restore a backup into an empty home and catalog, verified against its manifest, migrated to head.

    Refuses a home that is not empty and a catalog that has rows; a damaged file in the backup is
    named and nothing is restored.
    """
    from enginecache.service.maintenance.backup.usecases import restore as run_restore

    result = run_restore(app_context(ctx), src, pg_bin=pg_bin, progress=_progress(as_json))
    emit(
        result.to_dict(),
        as_json,
        f"restored {src} into {result.home} ({result.catalog}, revision {result.revision_backup} -> "
        f"{result.revision}): {result.models} models, {result.blobs} blobs, {result.files} files",
    )


def register(app: typer.Typer) -> None:
    """Add `backup` and `restore` to the CLI."""
    app.command()(backup)
    app.command()(restore)
