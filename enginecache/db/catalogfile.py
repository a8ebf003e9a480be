"""Which SQLite file a catalog URL names (and the stdlib URI that opens it), and the schema revision
this code expects: what a serving process's cache hit must know before it reads the catalog
(`service.serving.hitpath`), without the rest of `db.reader` (its row decoding, ~1 ms of a new process) or
Alembic.
"""

from __future__ import annotations

import functools
import os

VERSIONS_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "migrations", "versions")  # a str: no pathlib


# -- the schema's revision ---------------------------------------------------------------
# Read with str methods, not regular expressions: compiling three patterns was ~1 ms of every cache
# hit's new process, and the lines read are Alembic's own `revision = "..."` form.


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
