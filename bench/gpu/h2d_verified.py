"""GPU figure: an engine file -> pinned host buffer -> device, raw vs the product's verified read.

Run on the lent GPU machine (Python 3.12 with cuda-python; no package registry there):

    python3 bench/gpu/h2d_verified.py --out $OUT/h2d.json

with the blake3 wheel carried in the ignored `.whl/` folder of the checkout
(blake3==1.0.11, cp312 manylinux x86_64): when `import blake3` fails, the wheel is unpacked
into a temp dir and put on the path of this process and its children (a wheel is a zip; no
pip needed). The product's code comes from the checkout (`enginecache.core.hashing`, which
needs nothing but blake3 and the standard library).

Per size (1 GiB and 4 GiB by default; engine-sized files of random bytes, made in a temp dir
that is removed, and read once first so the page cache holds them), every sample is a NEW
PROCESS (bench/harness.py, interleaved round by round with the floor, after a warm-up):

- floor: `cudaHostAlloc` a pinned buffer, `readinto` the file into it (8 MiB chunks),
  `cudaMemcpy` host -> device;
- blake3 (goal <= 1.2x): the same, reading with `read_verified_into(path, pinned,
  blake3_digest=...)`: every byte hashed before the copy starts;
- sha256: the same with the sha256 digest (one stream: one core);
- pageable: what `read_verified` gives today (its own buffer, not pinned) copied from there.

Each child also times its phases (CUDA init, pinned + device alloc, read, copy) and prints them
(`BENCH_JSON`); the ratio is given both for the whole process (spawn to bytes on the device)
and for the file -> device span (read + copy), with GB/s for the read, the copy and the span.
After its ready mark each child copies the first and last MiB back and compares them.

`--dry-run` runs the same flow with no CUDA (pinned buffer = populated anonymous mmap, device
copy = memmove into a second one), to test the script anywhere:

    .venv/bin/python bench/gpu/h2d_verified.py --dry-run --sizes 64M,256M --out /tmp/h2d.json
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}
CHUNK = 8 * 1024 * 1024
MiB = 1024 * 1024
GOAL = 1.2
MODES = ("floor", "blake3", "sha256", "pageable")


def parse_size(text: str) -> int:
    unit = text[-1].upper()
    return int(float(text[:-1]) * UNITS[unit]) if unit in UNITS else int(text)


def ensure_blake3(wheels: Path) -> str | None:
    """Make `import blake3` work: installed, or unpacked from a carried wheel. Returns the dir
    put on sys.path (children get it through PYTHONPATH), or None when it was installed."""
    try:
        import blake3

        del blake3
        return None
    except ImportError:
        pass
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = sorted(wheels.glob(f"blake3-*-{tag}-*.whl")) if wheels.is_dir() else []
    if not found:
        raise SystemExit(f"blake3 is not installed and no blake3-*-{tag}-*.whl is in {wheels}")
    target = Path(tempfile.mkdtemp(prefix="h2d-blake3-"))
    atexit.register(shutil.rmtree, target, True)
    with zipfile.ZipFile(found[-1]) as wheel:
        wheel.extractall(target)
    sys.path.insert(0, str(target))
    import blake3  # noqa: F401

    return str(target)


# -- what a child does ------------------------------------------------------------------------


class Cuda:
    """cuda-python's runtime API: pinned host memory, device memory, one synchronous copy."""

    def __init__(self) -> None:
        try:
            from cuda.bindings import runtime as rt
        except ImportError:  # cuda-python before 12.8 spelled it so
            from cuda import cudart as rt  # type: ignore[no-redef]
        self.rt = rt
        self._check("cudaFree(0)", rt.cudaFree(0))  # creates the primary context

    def _check(self, call: str, result: Any) -> Any:
        values = result if isinstance(result, tuple) else (result,)
        if int(values[0]) != 0:
            raise RuntimeError(f"{call} failed: {values[0]}")
        return values[1] if len(values) == 2 else values[1:]

    def pinned(self, size: int) -> int:
        return int(self._check("cudaHostAlloc", self.rt.cudaHostAlloc(size, self.rt.cudaHostAllocDefault)))

    def device(self, size: int) -> int:
        return int(self._check("cudaMalloc", self.rt.cudaMalloc(size)))

    def h2d(self, device: int, host: int, size: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check("cudaMemcpy", self.rt.cudaMemcpy(device, host, size, kind))
        self._check("cudaDeviceSynchronize", self.rt.cudaDeviceSynchronize())

    def d2h(self, host: int, device: int, size: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check("cudaMemcpy", self.rt.cudaMemcpy(host, device, size, kind))

    def free(self, pinned: int, device: int) -> None:
        self._check("cudaFreeHost", self.rt.cudaFreeHost(pinned))
        self._check("cudaFree", self.rt.cudaFree(device))


class FakeCuda:
    """--dry-run: the same calls on host memory (pinned = an anonymous mmap, populated as
    cudaHostAlloc pins every page up front; the device copy is a memmove)."""

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}

    def _map(self, size: int, populate: bool) -> int:
        area = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            area.madvise(mmap.MADV_HUGEPAGE)
        if populate:
            try:
                area.madvise(23)  # MADV_POPULATE_WRITE (Linux 5.14)
            except OSError:
                for offset in range(0, size, 4096):
                    area[offset] = 0
        address = ctypes.addressof(ctypes.c_char.from_buffer(area))
        self._maps[address] = area
        return address

    def pinned(self, size: int) -> int:
        return self._map(size, populate=True)

    def device(self, size: int) -> int:
        return self._map(size, populate=False)

    def h2d(self, device: int, host: int, size: int) -> None:
        ctypes.memmove(device, host, size)

    def d2h(self, host: int, device: int, size: int) -> None:
        ctypes.memmove(host, device, size)

    def free(self, pinned: int, device: int) -> None:
        self._maps.clear()  # unmapped at exit: the exported ctypes views keep the maps alive


def child(mode: str, path: str, digest: str, dry_run: bool) -> None:
    from enginecache.core.verifiedread import read_verified, read_verified_into

    size = os.stat(path).st_size
    phases: dict[str, float] = {}
    t = time.perf_counter()
    gpu: Cuda | FakeCuda = FakeCuda() if dry_run else Cuda()
    phases["init_s"] = time.perf_counter() - t
    t = time.perf_counter()
    device = gpu.device(size)
    pinned = gpu.pinned(size)
    host = memoryview((ctypes.c_char * size).from_address(pinned)).cast("B")
    phases["alloc_s"] = time.perf_counter() - t
    keep: Any = None
    t = time.perf_counter()
    if mode == "floor":
        with open(path, "rb", buffering=0) as stream:
            offset = 0
            while offset < size:
                n = stream.readinto(host[offset : offset + CHUNK])
                if not n:
                    raise SystemExit("short read")
                offset += n
        source = pinned
    elif mode == "blake3":
        read_verified_into(Path(path), host, blake3_digest=digest)
        source = pinned
    elif mode == "sha256":
        read_verified_into(Path(path), host, sha256=digest)
        source = pinned
    elif mode == "pageable":
        keep = read_verified(Path(path), blake3_digest=digest)
        source = ctypes.addressof(ctypes.c_char.from_buffer(keep))
    else:
        raise SystemExit(f"unknown mode {mode}")
    phases["read_s"] = time.perf_counter() - t
    t = time.perf_counter()
    gpu.h2d(device, source, size)
    phases["h2d_s"] = time.perf_counter() - t
    print("BENCH_JSON", json.dumps(phases), flush=True)
    print("BENCH_READY", time.perf_counter(), flush=True)
    # Not timed: the device holds the file's bytes (first and last MiB back, compared).
    with open(path, "rb") as stream:
        for offset in sorted({0, max(0, size - MiB)}):
            n = min(MiB, size - offset)
            back = (ctypes.c_char * n)()
            gpu.d2h(ctypes.addressof(back), device + offset, n)
            stream.seek(offset)
            if bytes(back) != stream.read(n):
                raise SystemExit(f"device bytes differ at offset {offset}")
    del host
    gpu.free(pinned, device)


# -- the parent --------------------------------------------------------------------------------


def gpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        info = {
            "name": name.decode() if isinstance(name, bytes) else name,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            "pcie_gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
            "pcie_width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
            "pcie_gen_max": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
        }
        pynvml.nvmlShutdown()
    except Exception as err:  # noqa: BLE001 - recorded: the figure stands without NVML
        info["nvml_error"] = f"{type(err).__name__}: {err}"
    from importlib import metadata

    for name in ("cuda-python", "cuda-bindings", "cupy-cuda12x", "cupy-cuda13x", "torch", "nvidia-ml-py", "blake3"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info.setdefault("libraries", {})[name] = metadata.version(name)
    return info


def span_summary(figure: Any, size: int) -> dict[str, Any]:
    """The file -> device span (read + copy, timed inside each child): per-pair ratio and GB/s."""

    def span(sample: Any) -> float:
        return float(sample.extra["read_s"] + sample.extra["h2d_s"])

    ratios = [span(a) / span(b) for a, b in zip(figure.samples_a, figure.samples_b, strict=True)]
    out: dict[str, Any] = {
        "ratio_span": {"per_pair": ratios, "min": min(ratios), "median": statistics.median(ratios)},
        "goal_met_span": None if figure.goal_ratio is None else statistics.median(ratios) <= figure.goal_ratio,
    }
    for label, samples in (("a", figure.samples_a), ("b", figure.samples_b)):
        med = {
            k: statistics.median(float(s.extra[k]) for s in samples) for k in ("init_s", "alloc_s", "read_s", "h2d_s")
        }
        out[label] = {
            "median_s": med,
            "read_GBps": size / med["read_s"] / 1e9,
            "h2d_GBps": size / med["h2d_s"] / 1e9,
            "span_GBps": size / statistics.median(span(s) for s in samples) / 1e9,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="", help="default 1G,4G (--dry-run: 64M,256M)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="no CUDA: host memory stands in for the device")
    parser.add_argument("--work", type=Path, default=None, help="where the test files go (default: a temp dir)")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "PATH", "DIGEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, dry_run=args.dry_run)
        return

    blake3_dir = ensure_blake3(args.wheels)
    from bench_read import make_file
    from harness import Command, compare_many
    from hostinfo import machine_info

    from enginecache.core.hashing import hash_file

    sizes = [s.strip() for s in (args.sizes or ("64M,256M" if args.dry_run else "1G,4G")).split(",") if s.strip()]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [blake3_dir, os.environ.get("PYTHONPATH", "")]))}
    work = Path(tempfile.mkdtemp(prefix="h2d-", dir=args.work))
    result: dict[str, Any] = {
        "what": "engine file -> pinned host buffer -> device: raw readinto + cudaMemcpy vs "
        "read_verified_into + cudaMemcpy",
        "dry_run": args.dry_run,
        "goal_ratio": GOAL,
        "machine": machine_info(work),
        "gpu": {} if args.dry_run else gpu_info(),
        "blake3_from": blake3_dir or "installed",
        "sizes": [],
    }
    print(json.dumps({"machine": result["machine"]["cpu_model"], "gpu": result["gpu"].get("name")}), file=sys.stderr)
    try:
        for label in sizes:
            size = parse_size(label)
            path = work / f"engine-{label}.bin"
            make_file(path, size)
            digest = hash_file(path)  # one full read: the timed reads find the file in the page cache

            def command(mode: str, digest_hex: str = "", path: Path = path) -> Command:
                argv = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out)]
                argv += (["--dry-run"] if args.dry_run else []) + ["--child", mode, str(path), digest_hex or "-"]
                return Command(mode, argv, env=env)

            figures = compare_many(
                command("floor"),
                [
                    (command("blake3", digest.blake3), f"{label} BLAKE3 verified", GOAL, ""),
                    (command("sha256", digest.sha256), f"{label} sha256 verified", None, "one stream: one core"),
                    (command("pageable", digest.blake3), f"{label} read_verified, pageable", None, "not pinned"),
                ],
                section="file -> pinned -> device",
                pairs=args.pairs,
                params={"size": label, "size_bytes": size},
            )
            rows = []
            for figure in figures:
                span = span_summary(figure, size)
                rows.append({**figure.to_dict(), "span": span})
                print(
                    f"{figure.name}: span x{span['ratio_span']['median']:.3f} (min x{span['ratio_span']['min']:.3f}); "
                    f"ours {span['a']['span_GBps']:.2f} GB/s (read {span['a']['read_GBps']:.2f}, copy "
                    f"{span['a']['h2d_GBps']:.2f}); floor {span['b']['span_GBps']:.2f} GB/s; process "
                    f"x{figure.summary['ratio']['median']:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
            result["sizes"].append({"size": label, "bytes": size, "figures": rows})
            path.unlink()
    finally:
        for leftover in work.glob("*"):
            leftover.unlink()
        work.rmdir()
    result["machine"]["loadavg_at_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
