"""PostgreSQL's client programs (`pg_dump`, `pg_restore`) for backup and restore: finding them (in
--pg-bin, else on PATH), their version, and running them on the catalog's own connection. The
password of the catalog URL is passed in PGPASSWORD, never on a command line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from enginecache.db.catalog import Catalog
from enginecache.errors import BackupToolError


def find_tool(name: str, pg_bin: Path | None) -> Path:
    """The PostgreSQL client program `name`, in `pg_bin` where given, else on PATH."""
    found = shutil.which(name, path=str(pg_bin) if pg_bin is not None else None)
    if found is None:
        where = str(pg_bin) if pg_bin is not None else "PATH"
        raise BackupToolError(
            f"{name} is not in {where}: install the PostgreSQL client programs (the server's major version "
            "or newer), or name their folder with --pg-bin"
        )
    return Path(found)


def tool_version(tool: Path) -> tuple[int, str]:
    """(major, full version) of a PostgreSQL client program, from its `--version`."""
    done = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"\s(\d+)((?:\.\d+)*)", done.stdout)
    if done.returncode != 0 or found is None:
        raise BackupToolError(f"{tool} --version failed: {(done.stdout + done.stderr).strip()}")
    return int(found.group(1)), found.group(1) + found.group(2)


def libpq(catalog: Catalog) -> tuple[str, dict[str, str]]:
    """The catalog's connection as a libpq conninfo string for the client programs (what the catalog's
    own driver connects with), and their environment: the password goes in PGPASSWORD, never on a
    command line."""
    from psycopg.conninfo import make_conninfo

    _args, params = catalog.engine.dialect.create_connect_args(catalog.engine.url)
    options = {key: str(value) for key, value in params.items() if isinstance(value, (str, int)) and key != "password"}
    env = dict(os.environ)
    password = params.get("password")
    if password:
        env["PGPASSWORD"] = str(password)
    return make_conninfo("", **options), env


def run_tool(command: list[str], env: dict[str, str], what: str) -> None:
    """Run a client program; BackupToolError with the end of what it said when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        words = " ".join((done.stderr or done.stdout).split())[-2000:]
        raise BackupToolError(f"{what} failed (exit status {done.returncode}): {words}")
