"""Maintenance of a home: garbage collection of the store, backup and restore."""
