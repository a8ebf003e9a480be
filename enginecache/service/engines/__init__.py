"""Engines in the catalog: list, show, verify, check, delete, group for coverage, and the load
events and test-load runs recorded against them."""
