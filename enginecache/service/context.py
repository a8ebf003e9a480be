"""Where the product keeps its state: home directory, catalog URL, store."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from enginecache.db import catalogfile
from enginecache.db.catalogfile import DB_URL_ENV as DB_URL_ENV  # re-exported, as HOME_ENV
from enginecache.db.catalogfile import HOME_ENV as HOME_ENV
from enginecache.db.catalogfile import sqlite_url

if TYPE_CHECKING:  # imported on first use: a read command that needs neither never loads them
    from enginecache.core.store import ArtifactStore
    from enginecache.db.catalog import Catalog

DEFAULT_HOME = Path(catalogfile.DEFAULT_HOME)


@dataclass
class AppContext:
    """Home, store and catalog, opened lazily (the catalog migrates on first use)."""

    home: Path
    db_url: str
    tmp_dir: Path | None = None  # scratch space override (a job's own working directory)
    _catalog: Catalog | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, home: str | Path | None = None, db_url: str | None = None) -> AppContext:
        """The home and catalog URL from the arguments, else the environment, else the defaults
        (`db.catalogfile`'s names; `catalogfile.locate` finds the same catalog without SQLAlchemy)."""
        resolved_home = Path(home or os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser().resolve()
        url = db_url or os.environ.get(DB_URL_ENV) or sqlite_url(resolved_home / catalogfile.CATALOG_FILE)
        return cls(home=resolved_home, db_url=url)

    @property
    def store(self) -> ArtifactStore:
        from enginecache.core.store import ArtifactStore

        return ArtifactStore(self.home, tmp_dir=self.tmp_dir)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            from enginecache.db.catalog import Catalog

            self.home.mkdir(parents=True, exist_ok=True)
            self._catalog = Catalog(self.db_url)
        return self._catalog

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.dispose()
            self._catalog = None
