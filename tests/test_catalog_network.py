"""A PostgreSQL catalog across a network gives up on a dead peer instead of waiting on the kernel's
TCP retries (about 15 minutes): the connections carry libpq's connect timeout, keepalives and
`tcp_user_timeout` (`db.catalog.PG_NETWORK_DEFAULTS`), and a URL's own parameters win. The fleet
simulation (tests/test_fleet_netns.py) cuts a host's link under them."""

from __future__ import annotations

import sqlalchemy as sa

from enginecache.db.catalog import PG_NETWORK_DEFAULTS, Catalog, pg_network_args


def _parameters(catalog: Catalog) -> dict[str, str]:
    with catalog.engine.connect() as connection:
        return dict(connection.connection.dbapi_connection.info.get_parameters())  # type: ignore[union-attr]


def test_a_postgresql_catalog_connects_with_the_network_timeouts(pg_url: str) -> None:
    catalog = Catalog(pg_url)
    try:
        parameters = _parameters(catalog)
    finally:
        catalog.engine.dispose()
    for name, value in PG_NETWORK_DEFAULTS.items():
        assert parameters.get(name) == value, (name, parameters)


def test_a_url_that_sets_one_keeps_its_own(pg_url: str) -> None:
    url = sa.make_url(pg_url).update_query_dict({"tcp_user_timeout": "5000"}).render_as_string(hide_password=False)
    assert "tcp_user_timeout" not in pg_network_args(url)
    catalog = Catalog(url)
    try:
        parameters = _parameters(catalog)
    finally:
        catalog.engine.dispose()
    assert parameters["tcp_user_timeout"] == "5000" and parameters["keepalives_idle"] == "10"
