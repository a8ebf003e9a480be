"""Benchmark: `enginecache pull` from the object store against obstore's raw parallel ranged
download of the same object, at the same concurrency.

moto's S3 server (tests/s3kit.py, a subprocess on 127.0.0.1, authentication on) holds one engine
blob of 2 GiB (256 MiB with --quick) under its digest (hashed as a publish hashes it, chunk digests
too, and uploaded by obstore with a long timeout: moto takes more than obstore's default 30 s to
complete a multipart upload of 2 GiB); the catalog has an engine row naming it. Every sample is a
NEW PROCESS (bench/pull_child.py), timed from spawn to the blob on disk, interleaved pair by pair
with the floor: ours is the pull (the selection, 32 MiB ranged GETs through the store's client, each
chunk checked against its recorded BLAKE3 as it lands and written at its offset into the resume
state, fsynced, named, the manifest written); the floor is obstore by hand (the same ranges, as many
in flight, `os.pwrite` into one preallocated file, one fsync, nothing verified). Goal (issue 24):
the pull at least 0.8x the floor's throughput, i.e. at most 1.25x its time.

Run alone: `.venv/bin/python bench/bench_pull.py [--quick] [--sizes 512M,2G] [--pairs 3]`; or with
every benchmark through `make bench` (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from harness import Command, Report  # noqa: E402

from tests.s3kit import BUCKET, REGION  # noqa: E402

TITLE = "Pull from the object store"
UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}
SIZES = ("2G",)
QUICK_SIZES = ("256M",)
CONCURRENCY = 8  # ENGINECACHE_STORE_CONCURRENCY's default
GOAL = 1.25  # time ratio: 0.8x the floor's throughput
CHILD = BENCH / "pull_child.py"

NOTES = """
**Why moto bounds both.** moto answers a ranged GET by reading the whole object out of its
spooled temp file under the key's lock and slicing the range from it (moto/s3/models.py `FakeKey.value`,
moto/s3/responses.py `_handle_range_header`): every 32 MiB range costs a read of the whole object,
one range at a time, so a ranged download of an object of N bytes costs about N^2 / 32 MiB of
copying inside the server, and a 2 GiB object comes down at a few tens of MB/s however many ranges
are in flight. A single whole-object GET from the same server is one read (several hundred MB/s
here). Ours and the floor make the same requests, so the ratio says what the pull adds (selection,
chunk checks, the resume record, naming, the manifest); the absolute times say what moto costs,
not what S3 or MinIO would.

**What the pull does beyond the floor**: it opens the catalog and selects the engine, HEADs the
object for its size, hashes each 32 MiB chunk with BLAKE3 on the thread that fetched it (before
writing it), appends one line per chunk to the state's `done` record, fsyncs, links the file into
`objects/` and writes the manifest. Memory stays at one range per thread (8 x 32 MiB).
"""


def parse_size(text: str) -> int:
    unit = text[-1].upper()
    return int(float(text[:-1]) * UNITS[unit]) if unit in UNITS else int(text)


def make_file(path: Path, size: int) -> None:
    """`size` bytes of incompressible data, written in 64 MiB blocks."""
    block = os.urandom(min(size, 64 * 1024**2))
    with open(path, "wb") as stream:
        left = size
        while left:
            n = min(left, len(block))
            stream.write(block[:n])
            left -= n


def upload(server: Any, prefix: str, sha256: str, source: Path) -> None:
    """The blob into the bucket as a publish lays it out, by obstore with a long request timeout:
    moto takes longer than obstore's default 30 s to complete a multipart upload of 2 GiB."""
    import obstore
    from obstore.store import S3Store

    from enginecache.core.objectstore import blob_key

    store = S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=server.endpoint,
        region=REGION,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        client_options={"allow_http": True, "timeout": "30 minutes"},
    )
    key = blob_key(sha256)
    obstore.put(store, key, source, attributes={"sha256": sha256}, chunk_size=64 * 1024**2, max_concurrency=4)


def publish(folder: Path, size: int, server: Any, prefix: str) -> tuple[Any, dict[str, str]]:
    """An engine row whose blob (`size` random bytes) is in the bucket only; its catalog URL."""
    from enginecache.core.blobpaths import blob_relative
    from enginecache.core.store import ArtifactStore
    from enginecache.service.builds.plan import BuildRequest, build_engine
    from enginecache.service.context import AppContext
    from enginecache.service.models.register import register_model
    from tests.enginerows import engine_row_like
    from tests.modelfactory import make_mlp

    env = server.env(prefix)
    os.environ.update(env)
    app = AppContext.from_settings(folder / "builder", f"sqlite:///{folder / 'catalog.db'}")
    try:
        register_model(app, make_mlp(folder / "mlp.onnx"), name="mlp")
        built = build_engine(app, BuildRequest(model="mlp", backend="ort", precision="fp32")).engine
        source = folder / "engine.bin"
        make_file(source, size)
        info = ArtifactStore(folder / "hashed", remote=None).ingest_file(source)  # its digests, chunks too
        upload(server, prefix, info.sha256, source)
        source.unlink()
        info.path.unlink()  # the bucket's copy only: a pull from another home must download it
        row = engine_row_like(
            app,
            built,
            sha256=info.sha256,
            blake3=info.blake3,
            header_blake3=info.head_blake3,
            chunk_blake3=info.chunk_blake3,
            size_bytes=info.size,
            blob_path=blob_relative(info.sha256),
        )
        return row, {**env, "DB_URL": app.db_url}
    finally:
        app.close()


def run(report: Report) -> None:
    from tests.s3kit import S3Server

    report.section(
        TITLE,
        "Time from starting a new process to an engine blob pulled from a local S3 server (moto) onto disk: "
        "`enginecache pull` (parallel ranged GETs through the store's client, each 32 MiB chunk verified "
        f"against its recorded BLAKE3 as it lands, resumable) against obstore by hand (the same {CONCURRENCY} "
        "ranged GETs in flight, written at their offsets, unverified). Goal (issue 24): at least 0.8x the "
        "floor's throughput (at most 1.25x its time).",
        notes=NOTES,
    )
    sizes = report.options.get("pull_sizes") or (QUICK_SIZES if report.quick else SIZES)
    with tempfile.TemporaryDirectory(prefix="bench-pull-", dir=report.scratch) as tmp:
        folder = Path(tmp)
        server = S3Server().start()
        try:
            for label in sizes:
                size = parse_size(label)
                prefix = f"bench-{uuid.uuid4().hex[:8]}"
                row, env = publish(folder / label, size, server, prefix)
                db_url = env.pop("DB_URL")
                child_env = {**env, "ENGINECACHE_STORE_CONCURRENCY": str(CONCURRENCY)}
                dest = folder / label / "dest"
                serving = folder / label / "serving"  # a home without the blob: the pull downloads it
                ours = Command(
                    "enginecache pull",
                    [sys.executable, str(CHILD), "pull", str(serving), db_url, str(row.id), str(dest)],
                    child_env,
                )
                floor = Command(
                    "obstore get_range x8, pwrite",
                    [sys.executable, str(CHILD), "raw", row.sha256, str(size), str(dest), str(CONCURRENCY)],
                    child_env,
                )
                report.compare_many(
                    floor,
                    [(ours, f"{label} pull", GOAL, "chunk digests of 32 MiB")],
                    section=TITLE,
                    params={"size": label, "size_bytes": size, "concurrency": CONCURRENCY},
                )
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="", help="comma-separated, e.g. 512M,2G")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    report = Report(quick=args.quick, pairs=args.pairs, scratch=Path(tempfile.gettempdir()))
    if args.sizes:
        report.options["pull_sizes"] = [s.strip() for s in args.sizes.split(",") if s.strip()]
    run(report)
    for figure in report.figures:  # every sample, with the pull's own timing (`pull_s`)
        print(json.dumps(figure.to_dict()))


if __name__ == "__main__":
    main()
