"""Engines in the catalog: list, show, verify, check, delete, import (an engine built elsewhere:
`importing`, `provenance`), group for coverage, and the load events and test-load runs recorded
against them."""
