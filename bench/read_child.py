"""One read of an engine-sized file in a new process, the way bench/bench_read.py times it.

    python bench/read_child.py MODE PATH [DIGEST]

It prints `BENCH_READY <time.perf_counter()>` once the bytes are in memory (and verified, for
our modes), then exits. Only the modes that need enginecache import it, so a floor pays for
nothing it does not use. With BENCH_READ_PASS set it then reads every byte once more on one
thread, the way a runtime deserializing the buffer does, and prints that pass's time (`read_pass`).
Modes:

- floor: `readinto` in 8 MiB chunks into a buffer allocated the fastest way plain Python has
  (an anonymous private mmap with MADV_HUGEPAGE, so faulting it in costs 2 MiB pages, not 4 KiB
  ones). No hashing: the least a read of these bytes can cost in a new process.
- floor_pread: the read alone, on every core: positioned reads (`os.preadv`, one thread per core
  over 32 MiB ranges) into that buffer, no hashing (the floor on a host with many cores).
- floor_sum: what a verified read cannot do without, done apart on every core and added: positioned
  reads (`os.preadv`, one thread per core over 32 MiB ranges) into that buffer, then BLAKE3 of
  the same bytes with `max_threads=AUTO`. It checks its digest (a floor that read the wrong bytes
  would be no floor) and prints `BENCH_PARTS <read seconds> <hash seconds>` before BENCH_READY.
- byhand: `open(path, "rb").read()`, what people write when they load an engine by hand.
- blake3, blake3_bytes, sha256: `enginecache.core.verifiedread.read_verified` (bytes with
  `as_bytes=True`), DIGEST being the expected BLAKE3 or sha256 hex digest; blake3_chunks: the same
  with the chunk digests a catalog row records (DIGEST is `<blake3>/<chunk_blake3>`), each chunk
  checked as it lands: what a cache hit does where no read lease can be had.
- mapped_chunks: what a load does for a runtime that deserializes from memory (TensorRT) where the
  store file can be leased: a read lease (`core.filelease`), then `map_file` and its `verify`, the file mapped
  read-only and each chunk hashed from the mapping on every core (DIGEST as for blake3_chunks).
- ort_byhand, ort_ours, ort_before: an ORT-format engine to an `onnxruntime.InferenceSession`
  (the options `OrtEngineSession` uses) from `f.read()`, from `read_verified(as_bytes=True)`
  (the copy path, where no read lease can be had), and from `read_verified()` copied to `bytes`
  as the session did with a bytearray.
- ort_path, ort_inplace: `InferenceSession(path)` by hand (unverified), and the serving load of an
  ORT engine: a read lease, the file hashed in place, ORT reading it (`core.filelease`).
"""

from __future__ import annotations

import mmap
import os
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the floors pay for nothing)
if TYPE_CHECKING:
    from typing import Any

CHUNK = 8 * 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fill(path: str, view: memoryview, size: int) -> None:
    with open(path, "rb", buffering=0) as stream:
        offset = 0
        while offset < size:
            n = stream.readinto(view[offset : offset + CHUNK])
            if not n:
                raise SystemExit(f"{path}: short read")
            offset += n


def floor(path: str, size: int) -> object:
    buffer = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    fill(path, memoryview(buffer), size)
    return buffer


def floor_sum(path: str, size: int, digest: str, *, hash_too: bool = True) -> object:
    import threading

    buffer = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    view = memoryview(buffer)
    piece = 32 * 1024 * 1024
    starts = iter(range(0, size, piece))
    fd = os.open(path, os.O_RDONLY)
    started = time.perf_counter()

    def work() -> None:
        for start in starts:
            end = min(start + piece, size)
            offset = start
            while offset < end:
                n = os.preadv(fd, [view[offset:end]], offset)
                if not n:
                    raise SystemExit(f"{path}: short read")
                offset += n

    threads = [threading.Thread(target=work) for _ in range((os.cpu_count() or 1) - 1)]
    for thread in threads:
        thread.start()
    work()
    for thread in threads:
        thread.join()
    os.close(fd)
    read = time.perf_counter()
    if not hash_too:
        return buffer
    import blake3

    got = blake3.blake3(view[:size], max_threads=blake3.blake3.AUTO).hexdigest()
    hashed = time.perf_counter()
    if got != digest:
        raise SystemExit("floor_sum read the wrong bytes")
    print("BENCH_PARTS", read - started, hashed - read, flush=True)
    return buffer


def ort_from_file(ort: Any, mode: str, path: str, digest: str) -> object:
    """ort_path: `InferenceSession(path)` by hand, unverified. ort_inplace: what a serving load of an
    ORT engine does (service.serving.engineload): a read lease, the file hashed in place, ORT reading it."""
    if mode == "ort_path":
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.load_model_format", "ORT")
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    sys.path.insert(0, ROOT)
    from enginecache.core.backends.loadtypes import LoadSpec
    from enginecache.core.backends.ort.backend import ORT_BACKEND
    from enginecache.core.filelease import take_read_lease
    from enginecache.core.hashing import verify_file

    lease = take_read_lease(path)
    if lease is None:
        raise SystemExit(f"{path}: no read lease on this filesystem")
    with lease:
        verify_file(lease.path, blake3_digest=digest)
        session = ORT_BACKEND.load_file(lease.path, LoadSpec(label="bench"))
        if not lease.intact():
            raise SystemExit(f"{path}: the lease broke")
    return session


def ort_session(mode: str, path: str, digest: str) -> object:
    import onnxruntime as ort

    kept: object = None
    if mode in ("ort_path", "ort_inplace"):
        return ort_from_file(ort, mode, path, digest)
    if mode == "ort_byhand":
        with open(path, "rb") as stream:
            model = stream.read()
    else:
        sys.path.insert(0, ROOT)
        from pathlib import Path

        from enginecache.core.verifiedread import read_verified

        if mode == "ort_ours":
            model = read_verified(Path(path), blake3_digest=digest, as_bytes=True)
        else:  # as before: the caller holds the bytearray while the session makes its bytes copy
            kept = read_verified(Path(path), blake3_digest=digest)
            model = bytes(kept)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.use_ort_model_bytes_directly", "1")
    options.add_session_config_entry("session.load_model_format", "ORT")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return (kept, model, session)


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    digest = sys.argv[3] if len(sys.argv) > 3 else ""
    size = os.stat(path).st_size
    data: object
    if mode == "floor":
        data = floor(path, size)
    elif mode == "floor_sum":
        data = floor_sum(path, size, digest)
    elif mode == "floor_pread":
        data = floor_sum(path, size, digest, hash_too=False)
    elif mode == "byhand":
        with open(path, "rb") as stream:
            data = stream.read()
    elif mode == "blake3_chunks":
        sys.path.insert(0, ROOT)
        from enginecache.core import verifiedread
        from enginecache.core.verifiedread import read_verified

        if "BENCH_HASH_PIECE_BYTES" in os.environ:  # bench/gpu/host_read.py --variants: another piece size
            verifiedread.HASH_PIECE_BYTES = int(os.environ["BENCH_HASH_PIECE_BYTES"])

        whole, _, chunks = digest.partition("/")
        data = read_verified(path, blake3_digest=whole, chunk_blake3=chunks or None, as_bytes=True)
        if len(data) != size:
            raise SystemExit("wrong size")
    elif mode == "mapped_chunks":
        sys.path.insert(0, ROOT)
        from enginecache.core.filelease import take_read_lease
        from enginecache.core.verifiedread import map_file

        whole, _, chunks = digest.partition("/")
        lease = take_read_lease(path)
        if lease is None:
            raise SystemExit(f"{path}: no read lease on this filesystem")
        mapping = map_file(lease, name=path)
        mapping.verify(blake3_digest=whole, chunk_blake3=chunks or None)
        if len(mapping.view) != size:
            raise SystemExit("wrong size")
        data = (lease, mapping.view)  # the view is the runtime's while the lease stands
    elif mode in ("blake3", "blake3_bytes", "sha256"):
        sys.path.insert(0, ROOT)
        from pathlib import Path

        from enginecache.core.verifiedread import read_verified

        if mode == "sha256":
            data = read_verified(Path(path), sha256=digest)
        else:
            data = read_verified(Path(path), blake3_digest=digest, as_bytes=mode == "blake3_bytes")
        if len(data) != size:
            raise SystemExit("wrong size")
    elif mode.startswith("ort_"):
        data = ort_session(mode, path, digest)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("BENCH_READY", time.perf_counter(), flush=True)
    if os.environ.get("BENCH_READ_PASS"):
        read_pass(data)
    del data


def read_pass(data: object) -> None:
    """After BENCH_READY (not timed by the harness): one pass over every byte of the buffer on one
    thread, the way a runtime deserializing it reads it, timed here and printed as BENCH_JSON
    `read_pass_s`: a mapping whose pages are not in place would cost more here than a buffer's."""
    import json

    import numpy as np

    view = data[1] if isinstance(data, tuple) else data
    words = np.frombuffer(view, dtype=np.uint8)
    started = time.perf_counter()
    words.max()
    print("BENCH_JSON " + json.dumps({"read_pass_s": time.perf_counter() - started}), flush=True)


if __name__ == "__main__":
    main()
