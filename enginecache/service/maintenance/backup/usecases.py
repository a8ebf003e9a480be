"""Use cases: back up a home (the catalog and every blob it references) while others write, and
restore a backup into an empty home. docs/backup.md is the operator's page. This module is their
entry point; `backup` is service.maintenance.backup.create's, `restore` service.maintenance.backup.restore's.

A backup is a folder laid out as the store is, plus the catalog and a manifest (service.maintenance.backup.manifest):

    DEST/manifest.json                  what is here: catalog kind, revision, each file's digest and size
    DEST/catalog.db | catalog.dump      SQLite's online-backup copy | pg_dump's custom-format archive
    DEST/objects/sha256/<2 hex>/<sha>   the blobs the catalog copy references (engines, job inputs)
    DEST/models/<digest>/<files>        the model bundles it references (external data included)

Backup takes one consistent state of the catalog first (`service.maintenance.backup.database`: SQLite's backup API,
or pg_dump sharing an exported snapshot with the query that lists the references), then copies the
blobs *that state* references, hashing each as it is copied and comparing it with its digest (a
model bundle by the model digest's own rule). It holds the store's lock shared from before the
snapshot until the last copy, as a publish does, so `enginecache gc` (which takes it exclusive)
removes nothing meanwhile; publishers go on. Writes that commit after the snapshot are not in the
backup, and nothing the backup's catalog references can be missing from it: a READY engine's blob
or an OK model's bundle that is missing or damaged fails the backup (it names the blob); another
engine's blob (CORRUPT, RETIRED), a CORRUPT model's bundle or a blob a job's payload names that is
gone or damaged is left out and listed under `skipped`. The folder is written beside DEST and
renamed to DEST once complete: a failed backup leaves nothing at DEST. Nothing in the live catalog
or store is written (but the store's lock file).

Restore refuses a home that is not empty and a catalog that has rows, copies every file into a
folder beside the home while checking it against the manifest, puts the catalog back (the SQLite
file, or pg_restore in one transaction into the --db database), checks the row counts and that
every READY engine's blob and every OK model's bundle is there, migrates the catalog to the head
revision, and only then renames the folder to the home. A failure leaves the home as it was (and
drops what pg_restore created).
"""

from __future__ import annotations

from enginecache.service.maintenance.backup.create import BackupResult, backup
from enginecache.service.maintenance.backup.manifest import read_manifest
from enginecache.service.maintenance.backup.progress import Progress
from enginecache.service.maintenance.backup.restore import RestoreResult, restore

__all__ = ["BackupResult", "Progress", "RestoreResult", "backup", "read_manifest", "restore"]
