"""Benchmark: cache-hit `load_or_build` time vs ONNX size, and verified engine reads vs a raw readinto.

Part 1. For synthetic external-data ONNX models of 10 MB, 100 MB, 1 GB and 4 GB (a small MLP plus
one large unused initializer in an external data file: the digest covers every byte, the ORT
engine stays small), time cache-hit `load_or_build` calls split into lookup (ONNX fingerprint +
catalog) and engine load (verified read + deserialize), against the naive path that re-hashes the
ONNX on every start (what ONNX Runtime's TensorRT EP and Torch-TensorRT effectively do), measured
here by dropping the stat-cache row before each call so everything else is identical.

Part 2. Reading an engine-sized file: `read_verified` with BLAKE3 and with sha256 vs a raw
`readinto` of the same file into the same pre-sized buffer, side by side in one run.

Files are in the page cache (each is read once before timing): the naive curve is its best case.

Run by hand: `.venv/bin/python bench/bench_load_or_build.py [--sizes 10M,100M,1G,4G] [--repeat 5]`.
Results go to bench/results/load_or_build.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from sqlmodel import delete  # noqa: E402

from enginecache.core.hashing import hash_file  # noqa: E402
from enginecache.core.verifiedread import read_verified  # noqa: E402
from enginecache.db.models import StatCacheRecord  # noqa: E402
from enginecache.service.context import AppContext  # noqa: E402
from enginecache.service.serving.runtime import RuntimeSpec, load_or_build  # noqa: E402

CHUNK = 64 * 1024 * 1024
UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    return int(float(text[:-1]) * UNITS[text[-1].upper()]) if text[-1].upper() in UNITS else int(text)


def make_model(folder: Path, size: int) -> Path:
    """An MLP whose ONNX bundle totals about `size` bytes: one large unused initializer in `big.bin`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w")
    elements = max(1, size // 4)
    big = TensorProto()
    big.name = "big"
    big.data_type = TensorProto.FLOAT
    big.dims.append(elements)
    big.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "big.bin"), ("offset", "0"), ("length", str(elements * 4))):
        entry = big.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        "bench",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 32])],
        initializer=[weight, big],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    block = np.random.default_rng(1).bytes(CHUNK)
    with open(folder / "big.bin", "wb") as stream:
        left = elements * 4
        while left:
            n = min(left, CHUNK)
            stream.write(block[:n])
            left -= n
    past = time.time() - 120  # older than the racy window: the stat cache may trust it
    for name in ("model.onnx", "big.bin"):
        os.utime(folder / name, (past, past))
    return path


def warm(path: Path) -> None:
    """Read a file once so every timed read comes from the page cache."""
    buffer = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as stream:
        while stream.readinto(buffer):
            pass


def bench_load(app: AppContext, path: Path, repeat: int) -> dict[str, Any]:
    spec = RuntimeSpec(backend="ort")
    built = load_or_build(path, spec=spec, app=app, on_miss="build")  # miss: register, build, cache the stat
    built.close()
    for file in path.parent.iterdir():
        warm(file)

    def one(naive: bool) -> dict[str, float]:
        if naive:
            with app.catalog.write() as session:
                session.exec(delete(StatCacheRecord))  # type: ignore[call-overload]
        started = time.perf_counter()
        loaded = load_or_build(path, spec=spec, app=app, on_miss="fail")
        total = time.perf_counter() - started
        assert loaded.outcome == "hit"
        loaded.close()
        phases = loaded.phases
        engine_load = sum(v for k, v in phases.items() if k != "lookup")
        return {"lookup_s": phases["lookup"], "engine_load_s": engine_load, "total_s": total}

    one(False)  # warm the process (imports, catalog connection)
    cached = [one(False) for _ in range(repeat)]
    naive = [one(True) for _ in range(repeat)]

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "onnx_bytes": sum(f.stat().st_size for f in path.parent.iterdir()),
        "cached": {k: med(cached, k) for k in ("lookup_s", "engine_load_s", "total_s")},
        "naive": {k: med(naive, k) for k in ("lookup_s", "engine_load_s", "total_s")},
    }


def bench_read(path: Path, repeat: int) -> dict[str, Any]:
    digest = hash_file(path)
    size = path.stat().st_size
    warm(path)

    def raw() -> None:
        buffer = bytearray(size)
        view = memoryview(buffer)
        offset = 0
        with open(path, "rb", buffering=0) as stream:
            while offset < size:
                n = stream.readinto(view[offset : offset + 8 * 1024 * 1024])
                if not n:
                    break
                offset += n

    runs: dict[str, list[float]] = {"raw_readinto": [], "verified_blake3": [], "verified_sha256": []}
    for _ in range(repeat):  # interleaved, so drift hits all three alike
        for name, call in (
            ("raw_readinto", raw),
            ("verified_blake3", lambda: read_verified(path, blake3_digest=digest.blake3)),
            ("verified_sha256", lambda: read_verified(path, sha256=digest.sha256)),
        ):
            started = time.perf_counter()
            call()
            runs[name].append(time.perf_counter() - started)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "bytes": size,
        "seconds": medians,
        "gb_per_s": {k: size / v / 1e9 for k, v in medians.items()},
        "ratio_blake3": medians["verified_blake3"] / medians["raw_readinto"],
        "ratio_sha256": medians["verified_sha256"] / medians["raw_readinto"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10M,100M,1G,4G")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load_or_build.json")
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-lob-"))
    app = AppContext.from_settings(work / "home")
    load_rows = []
    read_rows = []
    for label in sizes:
        path = make_model(work / f"model-{label}", parse_size(label))
        row = {"size": label, **bench_load(app, path, args.repeat)}
        load_rows.append(row)
        c, n = row["cached"], row["naive"]
        ms = {f"{k}_{key}": v[key] * 1e3 for k, v in (("c", c), ("n", n)) for key in v}
        print(
            f"{label:>5}: lookup {ms['c_lookup_s']:8.2f} ms (stat cache) vs {ms['n_lookup_s']:9.2f} ms (re-hash); "
            f"engine load {ms['c_engine_load_s']:6.2f} ms; total {ms['c_total_s']:8.2f} vs {ms['n_total_s']:9.2f} ms",
            flush=True,
        )
        read = bench_read(path.parent / "big.bin", args.repeat)
        read_rows.append({"size": label, **read})
        print(
            f"{label:>5}: read {read['gb_per_s']['raw_readinto']:.2f} GB/s raw, "
            f"verified blake3 x{read['ratio_blake3']:.3f}, sha256 x{read['ratio_sha256']:.3f}",
            flush=True,
        )
    first, last = load_rows[0], load_rows[-1]
    summary = {
        "lookup_growth_cached": last["cached"]["lookup_s"] / first["cached"]["lookup_s"],
        "lookup_growth_naive": last["naive"]["lookup_s"] / first["naive"]["lookup_s"],
        "goal_cached_within_2x": last["cached"]["lookup_s"] / first["cached"]["lookup_s"] <= 2.0,
        "max_ratio_blake3": max(r["ratio_blake3"] for r in read_rows),
        "max_ratio_sha256": max(r["ratio_sha256"] for r in read_rows),
        "goal_blake3_within_1_15x": max(r["ratio_blake3"] for r in read_rows) <= 1.15,
    }
    result = {
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "repeat": args.repeat,
        "load_or_build": load_rows,
        "verified_read": read_rows,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    app.close()


if __name__ == "__main__":
    main()
