"""One download of an engine from the object store in a new process, the way bench/bench_pull.py
times it.

    python bench/pull_child.py pull HOME DB_URL ENGINE_ID DEST
    python bench/pull_child.py raw SHA256 SIZE DEST CONCURRENCY

The store, its keys and endpoint come from the environment (ENGINECACHE_STORE, AWS_*). It prints
`BENCH_READY <time.perf_counter()>` once the blob is on disk (the pull also `BENCH_JSON {"pull_s":
...}`, the pull call alone, without the interpreter's start and imports), then removes DEST (the
next sample starts from nothing). Modes:

- pull: `enginecache pull` as the CLI runs it (`service.fleet.pull.pull` with this host's home and
  the catalog): the engine selected, fetched by parallel ranged GETs, each 32 MiB chunk checked
  against its recorded BLAKE3 as it lands, written at its offset into the resume state, fsynced,
  given its name, the manifest written.
- raw: obstore by hand, the floor: the same object cut into the same 32 MiB ranges, CONCURRENCY
  ranged GETs (`obstore.get_range`) in flight on as many threads, each written with `os.pwrite` at
  its offset into one preallocated file, fsynced once. Nothing verified, nothing recorded.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 32 * 1024 * 1024


def ready() -> None:
    print(f"BENCH_READY {time.perf_counter()}", flush=True)


def pull(home: str, db_url: str, engine_id: str, dest: str) -> None:
    from enginecache.service.context import AppContext
    from enginecache.service.fleet.profiles import Wanted
    from enginecache.service.fleet.pull import pull as pull_engine

    imported = time.perf_counter()
    app = AppContext.from_settings(home, db_url)
    try:
        result = pull_engine(app, "mlp", Path(dest), wanted=Wanted(engine_id=int(engine_id)))
    finally:
        app.close()
    assert not result.up_to_date and result.copied_bytes > 0
    print(f'BENCH_JSON {{"pull_s": {time.perf_counter() - imported}}}', flush=True)
    ready()


def raw(sha256: str, size_text: str, dest: str, concurrency: str) -> None:
    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = os.environ["ENGINECACHE_STORE"][len("s3://") :].partition("/")
    store = S3Store(
        bucket,
        prefix=prefix or None,
        endpoint=os.environ["AWS_ENDPOINT_URL"],
        region=os.environ["AWS_REGION"],
        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        client_options={"allow_http": True},
    )
    key = f"objects/sha256/{sha256[:2]}/{sha256}"
    size = int(size_text)
    os.makedirs(dest)
    fd = os.open(os.path.join(dest, "blob"), os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, size)

    def one(start: int) -> None:
        data = memoryview(obstore.get_range(store, key, start=start, end=min(start + CHUNK, size)))
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], start + written)

    with ThreadPoolExecutor(int(concurrency)) as pool:
        list(pool.map(one, range(0, size, CHUNK)))
    os.fsync(fd)
    os.close(fd)
    ready()


def main() -> None:
    mode, *args = sys.argv[1:]
    dest = args[3] if mode == "pull" else args[2]
    try:
        {"pull": pull, "raw": raw}[mode](*args)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


if __name__ == "__main__":
    main()
