"""Backup and restore of a home: the catalog (SQLite or PostgreSQL) and the blobs it references."""
