"""GPU figure: an LLM-sized engine file from the page cache into device memory, verified, against
kvikio's raw `CuFile.pread` of the same file (issue 24, point 4).

Run on the lent GPU machine (Python 3.12 with CuPy; no package registry there), the kvikio-cu13,
libkvikio-cu13, rapids-logger and blake3 wheels installed from the carried `.whl/` folder:

    python3 bench/gpu/device_read.py --out $OUT/device_read.json [--sizes 13.5G] [--pairs 3]

First a correctness pass on a 256 MiB file (both product paths): the device holds exactly the
file's bytes (compared on the device), and a flipped byte is refused, named by its chunk. Then, per
size (13.5 GB by default: a 7B fp16 engine), every sample a NEW PROCESS (bench/harness.py,
interleaved round by round with the floor, after a warm-up), timed from spawn to the bytes on the
device (and verified, for ours); each child also times its span (file -> device) in-process:

- kvikio (floor): `kvikio.CuFile(path).pread(device_array)`, `num_threads` = the host's cores,
  unverified: what the product's path has to match (goal: ours at most 1.2x);
- ours, kvikio: `enginecache.core.deviceread.read_verified_to_device` (kvikio under a read lease,
  the file hashed where it lies at the same time, chunk digests checked);
- ours, pinned ring: the same with `use_kvikio=False` (one pinned chunk buffer and one stream per
  core: read, check, async copy), the fallback where kvikio is missing or no lease can be had;
- single stream: `readinto` a 64 MiB pinned buffer, copy, repeat (one thread, unverified);
- parallel pinned: the ring without hashing (one thread per core, unverified);
- and in-process: the pure host -> device copy of a pinned buffer, and BLAKE3 of the file on
  every core, in GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

GOAL = 1.2
MiB = 1024 * 1024
UNITS = {"K": 1024, "M": MiB, "G": 1000**3}  # G as in "a 13.5 GB engine"
MODES = ("kvikio", "ours_kvikio", "ours_ring", "single_stream", "parallel_pinned")


def parse_size(text: str) -> int:
    unit = text[-1].upper()
    return int(float(text[:-1]) * UNITS[unit]) if unit in UNITS else int(text)


def make_file(path: Path, size: int) -> None:
    """`size` bytes: one 256 MiB random block repeated (hashing and copying cost the same as for
    fresh random bytes; making them does not)."""
    block = os.urandom(min(size, 256 * MiB))
    with open(path, "wb") as stream:
        left = size
        while left:
            n = min(left, len(block))
            stream.write(block[:n])
            left -= n


def digests(path: Path) -> tuple[str, str]:
    """BLAKE3 of the file (every core) and its chunk list (one pass per chunk, threads)."""
    import blake3

    from enginecache.core.chunkdigests import CHUNK_DIGEST_BYTES, ChunkDigests, chunk_ranges

    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    whole.update_mmap(str(path))
    size = path.stat().st_size
    ranges = chunk_ranges(size, CHUNK_DIGEST_BYTES)
    found = [""] * len(ranges)
    fd = os.open(path, os.O_RDONLY)
    indices = iter(range(len(ranges)))

    def work() -> None:
        for index in indices:
            start, end = ranges[index]
            found[index] = blake3.blake3(os.pread(fd, end - start, start)).hexdigest()

    threads = [threading.Thread(target=work) for _ in range(os.cpu_count() or 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.close(fd)
    return whole.hexdigest(), ChunkDigests(CHUNK_DIGEST_BYTES, tuple(found)).encode()


# -- what a child does ------------------------------------------------------------------------


def _ring(path: str, address: int, size: int, piece: int, threads: int) -> None:
    """parallel_pinned: the product's ring without its hash (one pinned buffer and stream per thread)."""
    import cupy

    fd = os.open(path, os.O_RDONLY)
    starts = iter(range(0, size, piece))

    def work() -> None:
        pinned = cupy.cuda.alloc_pinned_memory(piece)
        view = memoryview(pinned).cast("B")
        stream = cupy.cuda.Stream(non_blocking=True)
        for start in starts:
            stream.synchronize()
            length = min(piece, size - start)
            done = 0
            while done < length:
                done += os.preadv(fd, [view[done:length]], start + done)
            cupy.cuda.runtime.memcpyAsync(address + start, pinned.ptr, length, 1, stream.ptr)
        stream.synchronize()

    workers = [threading.Thread(target=work) for _ in range(threads - 1)]
    for worker in workers:
        worker.start()
    work()
    for worker in workers:
        worker.join()
    os.close(fd)


def _single_stream(path: str, address: int, size: int) -> None:
    import cupy

    piece = 64 * MiB
    pinned = cupy.cuda.alloc_pinned_memory(piece)
    view = memoryview(pinned).cast("B")
    with open(path, "rb", buffering=0) as stream:
        offset = 0
        while offset < size:
            n = stream.readinto(view[: min(piece, size - offset)])
            cupy.cuda.runtime.memcpy(address + offset, pinned.ptr, n, 1)
            offset += n


def child(mode: str, path: str, digest: str) -> None:
    phases: dict[str, float] = {}
    t = time.perf_counter()
    import cupy
    import kvikio
    import kvikio.defaults

    from enginecache.core.deviceread import read_verified_to_device

    cupy.cuda.runtime.free(0)  # the context
    kvikio.defaults.set("num_threads", os.cpu_count() or 1)  # as the product sets it
    phases["init_s"] = time.perf_counter() - t
    size = os.stat(path).st_size
    t = time.perf_counter()
    device = cupy.empty(size, dtype=cupy.uint8)
    phases["alloc_s"] = time.perf_counter() - t
    whole, _, chunks = digest.partition("/")
    t = time.perf_counter()
    if mode == "kvikio":
        with kvikio.CuFile(path, "r") as source:
            if source.pread(device, size, 0).get() != size:
                raise SystemExit("short read")
    elif mode in ("ours_kvikio", "ours_ring"):
        read_verified_to_device(
            path, device, blake3_digest=whole, chunk_blake3=chunks, use_kvikio=None if mode == "ours_kvikio" else False
        )
    elif mode == "single_stream":
        _single_stream(path, device.data.ptr, size)
    elif mode == "parallel_pinned":
        _ring(path, device.data.ptr, size, 32 * MiB, os.cpu_count() or 1)
    else:
        raise SystemExit(f"unknown mode {mode}")
    cupy.cuda.runtime.deviceSynchronize()
    phases["read_s"] = time.perf_counter() - t
    print("BENCH_JSON", json.dumps(phases), flush=True)
    print("BENCH_READY", time.perf_counter(), flush=True)
    # Not timed: the device holds the file's bytes (first, middle and last MiB back, compared).
    with open(path, "rb") as stream:
        for offset in sorted({0, size // 2, max(0, size - MiB)}):
            n = min(MiB, size - offset)
            stream.seek(offset)
            if device[offset : offset + n].get().tobytes() != stream.read(n):
                raise SystemExit(f"{mode}: device bytes differ at offset {offset}")


# -- the parent --------------------------------------------------------------------------------


def kernel_check() -> dict[str, Any]:
    """`core.gpublake3` against the `blake3` package, on sizes around every boundary of its tree
    (a block, a 1 KiB chunk, a thread block of 256 chunks, a piece), pieces of 256 KiB and 32 MiB."""
    import blake3
    import cupy
    import numpy as np

    from enginecache.core.gpublake3 import device_chunk_digests

    rng = np.random.default_rng(1)
    failures = []
    checked = 0
    cases = [(n, 256 * 1024) for n in (1, 63, 64, 65, 1023, 1024, 1025, 2048, 3000, 262143, 262144, 262145, 600000)]
    piece = 32 * MiB
    cases += [(n, piece) for n in (1, 1024, 1025, 262145, piece - 1, piece, piece + 1, 3 * piece + 12345)]
    for size, chunk in cases:
        data = rng.bytes(size)
        device = cupy.asarray(np.frombuffer(data, dtype=np.uint8))
        got = device_chunk_digests(device.data.ptr, size, chunk)
        want = [blake3.blake3(data[i : i + chunk]).hexdigest() for i in range(0, size, chunk)]
        checked += 1
        if got != want:
            failures.append({"size": size, "chunk": chunk})
    out = {"cases": checked, "failures": failures}
    print(f"gpu blake3 kernels: {out}", file=sys.stderr, flush=True)
    return out


def correctness(work: Path) -> dict[str, Any]:
    """Both product paths on a 256 MiB file: exact bytes on the device; a flipped byte refused and
    named by its chunk, the blob restored after."""
    import cupy
    import numpy as np

    from enginecache.core.deviceread import read_verified_to_device
    from enginecache.errors import IntegrityCheckError

    path = work / "check.bin"
    path.write_bytes(np.random.default_rng(0).bytes(256 * MiB + 12345))
    whole, chunks = digests(path)
    expected = cupy.asarray(np.fromfile(path, dtype=np.uint8))
    out: dict[str, Any] = {}
    for kvik in (None, False):
        name = "kvikio + GPU hash" if kvik is None else "ring"
        device = cupy.zeros(path.stat().st_size, dtype=cupy.uint8)
        read_verified_to_device(path, device, blake3_digest=whole, chunk_blake3=chunks, use_kvikio=kvik)
        same = bool((device == expected).all())
        with open(path, "r+b") as stream:
            stream.seek(100 * MiB + 7)
            byte = stream.read(1)
            stream.seek(100 * MiB + 7)
            stream.write(bytes([byte[0] ^ 1]))
        try:
            read_verified_to_device(path, device, blake3_digest=whole, chunk_blake3=chunks, use_kvikio=kvik)
            refused = "not refused"
        except IntegrityCheckError as err:
            refused = str(err)
        finally:
            with open(path, "r+b") as stream:
                stream.seek(100 * MiB + 7)
                stream.write(byte)
        out[name] = {"bytes_equal_on_device": same, "flipped_byte": refused, "named_chunk_3": "chunk 3 (" in refused}
        print(f"correctness {name}: {out[name]}", file=sys.stderr, flush=True)
    path.unlink()
    return out


def in_process_rates(path: Path) -> dict[str, float]:
    """Pure pinned host -> device copy (1 GiB, best of 5) and BLAKE3 of the file on every core."""
    import blake3
    import cupy

    size = 1024 * MiB
    pinned = cupy.cuda.alloc_pinned_memory(size)
    device = cupy.empty(size, dtype=cupy.uint8)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        cupy.cuda.runtime.memcpy(device.data.ptr, pinned.ptr, size, 1)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    b3 = blake3.blake3(max_threads=blake3.blake3.AUTO)
    b3.update_mmap(str(path))
    b3.hexdigest()
    hashed = time.perf_counter() - t
    return {"h2d_pinned_GBps": size / min(times) / 1e9, "blake3_all_cores_GBps": path.stat().st_size / hashed / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="13.5G")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("MODE", "PATH", "DIGEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    from h2d_verified import gpu_info
    from harness import Command, compare_many
    from hostinfo import machine_info

    work = Path(tempfile.mkdtemp(prefix="device-read-", dir=args.work))
    result: dict[str, Any] = {
        "what": "engine file (page cache) -> device memory: kvikio raw vs the product's verified device read",
        "goal_ratio": GOAL,
        "machine": machine_info(work),
        "gpu": gpu_info(),
        "sizes": [],
    }
    try:
        result["gpu_blake3"] = kernel_check()
        result["correctness"] = correctness(work)
        for label in [s.strip() for s in args.sizes.split(",") if s.strip()]:
            size = parse_size(label)
            path = work / "engine.bin"
            make_file(path, size)
            whole, chunks = digests(path)  # reads it once: the timed reads find it in the page cache
            rates = in_process_rates(path)
            print(f"{label}: {rates}", file=sys.stderr, flush=True)

            def command(mode: str, path: Path = path, digest: str = f"{whole}/{chunks}") -> Command:
                argv = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out), "--child"]
                return Command(mode, [*argv, mode, str(path), digest])

            figures = compare_many(
                command("kvikio"),
                [
                    (command("ours_kvikio"), f"{label} ours, kvikio + GPU BLAKE3", GOAL, ""),
                    (command("ours_ring"), f"{label} ours, pinned ring", None, "fallback"),
                    (command("single_stream"), f"{label} single stream, pinned", None, "unverified"),
                    (command("parallel_pinned"), f"{label} parallel pinned ring", None, "unverified"),
                ],
                section="file -> device",
                pairs=args.pairs,
                warmup=1,
                params={"size": label, "size_bytes": size},
            )
            rows = []
            for figure in figures:
                spans_a = [float(s.extra["read_s"]) for s in figure.samples_a]
                spans_b = [float(s.extra["read_s"]) for s in figure.samples_b]
                ratios = [a / b for a, b in zip(spans_a, spans_b, strict=True)]
                span: dict[str, Any] = {
                    "ratio_span": {"per_pair": ratios, "min": min(ratios), "median": statistics.median(ratios)},
                    "a_GBps": size / statistics.median(spans_a) / 1e9,
                    "floor_GBps": size / statistics.median(spans_b) / 1e9,
                    "goal_met_span": None
                    if figure.goal_ratio is None
                    else statistics.median(ratios) <= figure.goal_ratio,
                }
                rows.append({**figure.to_dict(), "span": span})
                print(
                    f"{figure.name}: process x{figure.summary['ratio']['median']:.3f} "
                    f"(min x{figure.summary['ratio']['min']:.3f}); span x{span['ratio_span']['median']:.3f}; "
                    f"{span['a_GBps']:.1f} GB/s vs kvikio {span['floor_GBps']:.1f} GB/s",
                    file=sys.stderr,
                    flush=True,
                )
            result["sizes"].append({"size": label, "bytes": size, "rates": rates, "figures": rows})
            path.unlink()
    finally:
        for leftover in work.glob("*"):
            leftover.unlink()
        work.rmdir()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
