"""The schema revision of a backup's catalog: whether this version knows it (a backup made by a newer
version is refused), and bringing a restored catalog to the head revision."""

from __future__ import annotations

from enginecache.db.catalog import MIGRATIONS_DIR, head_revision
from enginecache.service.maintenance.backup.database import connection_query, open_catalog, read_revision


def migrate_to_head(url: str) -> str | None:
    """Bring a restored catalog to the head revision; returns the revision it is at."""
    with open_catalog(url) as catalog:
        # Not Catalog.migrate(): it runs once per URL and process, and this process may have opened
        # the target database (and remembered it as current) before the restore put an older schema there.
        if not catalog._at_head():
            catalog._upgrade()
        with catalog.connect() as connection:
            return read_revision(connection_query(connection))


def known_revision(revision: str | None) -> bool:
    """Whether a backup's schema revision is one of this version's migrations (None: no schema yet)."""
    if revision is None or revision == head_revision():
        return True
    from alembic.script import ScriptDirectory

    known = {script.revision for script in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()}
    return all(part in known for part in revision.split(","))
