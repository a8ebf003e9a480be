"""Where the catalog is and at which schema revision, for both ways of opening it: the SQLAlchemy
`db.catalog.Catalog` (any database; it migrates) and the stdlib `sqlite3` of a cache hit
(`service.serving.hitpath`) and the CLI's reads (`db.reader`), neither of which imports Alembic.

- `locate(home, db_url)`: the store's home and, where the catalog is an existing SQLite file, that
  file, resolved as `service.context.AppContext.from_settings` resolves them (`HOME_ENV`, `DB_URL_ENV`,
  `DEFAULT_HOME`).
- `head_revision()`: the newest migration, read from the files in migrations/versions with `str`
  methods (tests/test_catalog_open.py checks it against Alembic's ScriptDirectory); `is_head(versions)`:
  whether a catalog's `alembic_version` rows (`REVISION_SQL`) are exactly that revision.
- The SQLite URL helpers: `sqlite_url`, `sqlite_file`, `sqlite_file_uri`.

Imports nothing but `os` and `functools` (a cache hit's new process pays for every module).
"""

from __future__ import annotations

import functools
import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Iterable

VERSIONS_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "migrations", "versions")  # a str: no pathlib
HOME_ENV = "ENGINECACHE_HOME"
DB_URL_ENV = "ENGINECACHE_DB_URL"
DEFAULT_HOME = "engines"
CATALOG_FILE = "catalog.db"  # in the home, where no URL names another catalog
REVISION_SQL = "SELECT version_num FROM alembic_version"


class CatalogFile:
    """The store's home and its SQLite catalog file, as strings (a cache hit builds no `pathlib.Path`:
    `core.pathtext` says why)."""

    __slots__ = ("home", "path")

    def __init__(self, home: str, path: str) -> None:
        self.home = home
        self.path = path


def locate(home: str | os.PathLike[str] | None, db_url: str | None) -> CatalogFile | None:
    """Where `AppContext.from_settings(home, db_url)` opens its catalog, when that is an existing SQLite
    file; None otherwise (PostgreSQL, in-memory, URL parameters, no catalog yet)."""
    # `Path(home).expanduser().resolve()`, as a str (core.pathtext.resolved_text; db imports no core)
    resolved = os.path.realpath(os.path.expanduser(os.fspath(home or os.environ.get(HOME_ENV) or DEFAULT_HOME)))
    url = db_url or os.environ.get(DB_URL_ENV) or None
    file = os.path.join(resolved, CATALOG_FILE) if url is None else sqlite_file(url)
    if file is None or not os.path.isfile(file):
        return None
    return CatalogFile(resolved, file)


# -- the schema's revision ---------------------------------------------------------------
# Read with str methods, not regular expressions (a cache hit compiles no pattern): the lines read are
# Alembic's own `revision = "..."` form; tests/test_catalog_open.py holds the head to Alembic's.


def _assigned(text: str, name: str) -> str | None:
    """The value of the first line `name = VALUE` (or `name: TYPE = VALUE`) that starts a line of
    `text`, stripped; None where there is none or it is empty."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :].lstrip()
        if rest.startswith(":"):
            rest = rest[rest.find("=") :] if "=" in rest else ""
        if rest.startswith("=") and not rest.startswith("=="):
            return rest[1:].strip() or None
    return None


def _quoted(text: str) -> list[str]:
    """Every non-empty quoted run of `text`, `"a"` or `'a'`, left to right (a quote of either kind
    closes it): the revision names of a value like `"0014"` or `("0012", "0013")`."""
    found: list[str] = []
    start = 0
    while True:
        opening = min((p for p in (text.find('"', start), text.find("'", start)) if p >= 0), default=-1)
        if opening < 0:
            return found
        closing = opening + 1
        while closing < len(text) and text[closing] not in "\"'":
            closing += 1
        if closing >= len(text):
            return found
        if closing > opening + 1:
            found.append(text[opening + 1 : closing])
            start = closing + 1
        else:
            start = closing  # an empty pair: its second quote may open the next run


@functools.cache
def head_revision() -> str | None:
    """The newest migration's revision, read from the files in migrations/versions without importing
    Alembic: the one revision no other migration names as its `down_revision`. None where that is not
    one revision (a branch, a file this reader cannot parse): then only Alembic can say."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for name in sorted(n for n in os.listdir(VERSIONS_DIR) if n.endswith(".py") and not n.startswith(".")):
        with open(os.path.join(VERSIONS_DIR, name), encoding="utf-8") as stream:
            text = stream.read()
        revision = _assigned(text, "revision")
        down = _assigned(text, "down_revision")
        names = _quoted(revision) if revision else []
        if len(names) != 1 or down is None:
            return None
        revisions.add(names[0])
        parents.update(_quoted(down))
    heads = revisions - parents
    return next(iter(heads)) if len(heads) == 1 and parents <= revisions else None


def is_head(versions: Iterable[str]) -> bool:
    """Whether a catalog whose `alembic_version` rows are `versions` is at this code's head revision
    (False where the head cannot be read without Alembic)."""
    head = head_revision()
    return head is not None and set(versions) == {head}


# -- SQLite URLs ----------------------------------------------------------------------------


def sqlite_url(path: str | os.PathLike[str]) -> str:
    return f"sqlite:///{path}"


def sqlite_file(url: str) -> str | None:
    """The database file of a plain `sqlite:///PATH` URL (no driver, no query string), else None."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or "?" in url:
        return None
    path = url[len(prefix) :]
    return path if path and path != ":memory:" else None


def sqlite_file_uri(path: str) -> str:
    """A read-write SQLite URI of an existing file: `file:PATH?mode=rw`, with the three characters
    SQLite's URI parser gives a meaning to in a path escaped (%, ? and #; every other byte is the
    file name's own). An absolute path gets an empty authority (`file://` + path), so one that
    starts with `//` is not read as a host name."""
    escaped = path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    return f"file:{'//' if escaped.startswith('/') else ''}{escaped}?mode=rw"
