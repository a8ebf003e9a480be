"""LLM scale: the Llama-like decoder (tests/llamamodel.py) of about a billion parameters, built.

The model is written once (random fp16 weights as external data, no download) and registered in a
template home. Each figure is a build in a new process beside its floor, the same build by hand:

- TensorRT-RTX fp16 (the graph already computes in fp16, so no converter runs): `enginecache build`
  against a script that parses the file strongly typed, sets the target's compute capability and
  the same optimization profile, and writes the plan;
- ONNX Runtime: `enginecache build --backend ort` against a CPU session that saves its optimized
  model in ORT format.

Each pair reports wall clock, peak RSS (the build's process tree) and the engine's size. A build
takes minutes at this size, so a figure is one pair (two with --quick, which uses the 0.1B model).

    .venv/bin/python bench/run_all.py --only bench_llm [--quick]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from harness import Command, Figure  # noqa: E402

from tests.llamamodel import PRESETS, parameter_count, write_llama  # noqa: E402

SECTION = "LLM scale: a Llama-like decoder built"
TARGET = "sm89"
MODEL = "llama"
# ONNX Runtime stores an engine in ORT format (a flatbuffer, 2 GiB at most) with its fp16 weights as
# fp32: the 1B model's would be 3.8 GB, past what the format holds, so ORT builds the 0.1B one.
ORT_PRESET = "0.1b"
ORT_LIMIT = (
    "\n\nOurs includes the CLI's start, the job's queue and worker, hashing the model where it is stored (under "
    "read leases: no copy), the catalog, and hashing the engine where it was built before linking it into the "
    "store; the floors write the engine and nothing else. ONNX Runtime builds the 0.1B model: its "
    "engine is an ORT-format flatbuffer, which holds at most 2 GiB, and its CPU optimizer stores fp16 weights as "
    "fp32 (the 1B model's engine would be 3.8 GB; ORT refuses to write it)."
)


def _profiles(preset: str) -> list[str]:
    """One optimization profile for every dynamic input: batch 1..4, sequence 1..512 (opt 128),
    past 1..512 (opt 128)."""
    config = PRESETS[preset]
    tokens = "1x1,1x128,4x512"
    kv, d = config.kv_heads, config.head_dim
    past = f"1x{kv}x1x{d},1x{kv}x128x{d},4x{kv}x512x{d}"
    names = [f"past_key_values.{layer}.{kind}" for layer in range(config.layers) for kind in ("key", "value")]
    return [f"input_ids={tokens}", f"position_ids={tokens}", *(f"{name}={past}" for name in names)]


def _template(scratch: Path, preset: str) -> tuple[Path, Path, float]:
    """The model file and a home with it registered (no engine); the seconds writing it took."""
    from enginecache.service.context import AppContext
    from enginecache.service.models.register import register_model

    started = time.perf_counter()
    model = write_llama(scratch / "model" / "llama.onnx", preset, "fp16")
    written = time.perf_counter() - started
    home = scratch / "template"
    app = AppContext.from_settings(home)
    try:
        register_model(app, model, name=MODEL)
    finally:
        app.close()
    return model, home, written


def _engine_mib(figure: Figure, side: str) -> str:
    samples = figure.samples_a if side == "a" else figure.samples_b
    sizes = {s.extra.get("engine_bytes") for s in samples}
    return ", ".join(f"{size / 2**20:,.0f} MiB" for size in sorted(s for s in sizes if s))


def _table(figures: list[Figure]) -> str:
    rows = [
        "| build | ours: wall, peak RSS, engine | floor: wall, peak RSS, engine |",
        "| --- | --- | --- |",
    ]
    for figure in figures:
        a, b = figure.summary["a"], figure.summary["b"]
        rows.append(
            f"| {figure.name} | {a['wall_s']['median']:.1f} s, {a['maxrss_bytes']['max'] / 2**30:.2f} GiB, "
            f"{_engine_mib(figure, 'a')} | {b['wall_s']['median']:.1f} s, {b['maxrss_bytes']['max'] / 2**30:.2f} GiB, "
            f"{_engine_mib(figure, 'b')} |"
        )
    return "\n".join(rows)


DEVICE_RESULTS = BENCH / "results" / "device_read_h200.json"


def device_table(path: Path = DEVICE_RESULTS) -> str:
    """The committed H200 figures of bench/gpu/device_read.py as a table (not re-run here: no GPU)."""
    import json

    if not path.is_file():
        return "No H200 device figures are committed (bench/gpu/device_read.py writes them on a GPU host)."
    data = json.loads(path.read_text())
    lines = [
        f"**On the GPU** ({data['gpu'].get('name', 'GPU')}, {data['machine'].get('cores', '?')} cores; "
        "bench/gpu/device_read.py, committed as bench/results/device_read_h200.json; not re-run by `make bench`, "
        "which has no GPU): an engine-sized file from the page cache into device memory, each sample a new process "
        "interleaved with the floor, kvikio's raw `CuFile.pread` (unverified).",
        "",
        "| size | path | new process: ratio median (min) | file -> device | kvikio alone |",
        "| --- | --- | --- | --- | --- |",
    ]
    for entry in data["sizes"]:
        for figure in entry["figures"]:
            ratio, span = figure["summary"]["ratio"], figure["span"]
            goal = f" (goal {figure['goal_ratio']}x)" if figure.get("goal_ratio") else ""
            lines.append(
                f"| {entry['size']}B | {figure['name'].split(' ', 1)[1]} | {ratio['median']:.3f}x "
                f"({ratio['min']:.3f}x){goal} | {span['a_GBps']:.1f} GB/s | {span['floor_GBps']:.1f} GB/s |"
            )
        rates = entry.get("rates", {})
        lines.append("")
        lines.append(
            f"Pure pinned host -> device copy {rates.get('h2d_pinned_GBps', 0):.1f} GB/s; BLAKE3 of the file on every "
            f"core {rates.get('blake3_all_cores_GBps', 0):.1f} GB/s. The GPU BLAKE3 kernels matched the `blake3` "
            f"package on {data['gpu_blake3']['cases']} sizes around every boundary of the tree "
            f"({len(data['gpu_blake3']['failures'])} failures); both device paths left exactly the file's bytes on "
            "the device and named a flipped byte's chunk."
        )
    return "\n".join(lines)


HOST_SECTION = "verified read, 16-core host"
# bench/gpu/host_read.py's runs on the H200 machine, newest first; a figure named in an earlier file wins.
HOST_RESULTS = [
    BENCH / "results" / name
    for name in ("verified_read_mapped_h200.json", "verified_read_chunks_h200.json", "verified_read_h200.json")
]


def host_figures(paths: list[Path] = HOST_RESULTS) -> list[Figure]:
    """The committed 16-core host figures (bench/gpu/host_read.py), the first of each name."""
    import json

    found: dict[str, Figure] = {}
    for path in paths:
        if path.is_file():
            for item in json.loads(path.read_text())["figures"]:
                figure = Figure.from_dict(item)
                if figure.section == HOST_SECTION:
                    found.setdefault(figure.name, figure)
    return list(found.values())


def _ratio_cell(figure: Figure | None) -> str:
    """`ms median | ratio median (min): goal verdict` of one figure, or dashes where it was not run."""
    if figure is None:
        return "- | -"
    s = figure.summary
    goal = f": {'met' if s['goal_met'] else 'missed'}" if figure.goal_ratio else ""
    return f"{s['a']['ready_s']['median'] * 1e3:,.0f} | {s['ratio']['median']:.2f}x ({s['ratio']['min']:.2f}x){goal}"


def _read_pass_text(found: dict[str, Figure], size: str) -> str:
    """What one pass over every byte on one thread after the read cost (the children's `read_pass_s`,
    bench/read_child.py BENCH_READ_PASS), from the mapping and from the floor's buffer; empty where
    the run did not time it."""
    import statistics

    mapped = found.get("mapped_chunks")
    if mapped is None:
        return ""
    ours = [s.extra["read_pass_s"] for s in mapped.samples_a if "read_pass_s" in s.extra]
    floor = [s.extra["read_pass_s"] for s in mapped.samples_b if "read_pass_s" in s.extra]
    if not ours or not floor:
        return ""
    return (
        f" (one pass over every byte on one thread afterwards, as a runtime deserializing it reads it: "
        f"{statistics.median(ours):.2f} s from the mapping, {statistics.median(floor):.2f} s from the floor's "
        f"buffer, medians at {size}B)"
    )


def host_table(paths: list[Path] = HOST_RESULTS) -> str:
    """The committed 16-core host figures as a table, with what their CPU times say (not re-run here)."""
    figures = host_figures(paths)
    by_size: dict[str, dict[str, Figure]] = {}
    for f in figures:
        if "," not in f.name:  # the chunk and piece variants are quoted below
            by_size.setdefault(f.params["size"], {})[f.a] = f
    sizes = sorted(
        (size for size, found in by_size.items() if "blake3_chunks" in found),
        key=lambda size: by_size[size]["blake3_chunks"].params["size_bytes"],
    )
    if not sizes:
        return "No 16-core host figures are committed (bench/gpu/host_read.py writes them on the GPU machine)."
    lines = [
        "**On a 16-core host** (the H200 machine's CPUs; bench/gpu/host_read.py, committed as "
        "bench/results/verified_read_mapped_h200.json, verified_read_chunks_h200.json and verified_read_h200.json, "
        "charts by bench/gpu/h200_charts.py), against the floor issue 24 sets for a host with many cores: "
        "positioned reads on every core into a new buffer, nothing hashed (goal: at most 1.2x). Two of ours: the "
        "leased mapping a load hands a runtime that deserializes from memory (TensorRT; `map_file`: the store "
        "file mapped read-only under a read lease, each chunk hashed from the mapping on every core), and "
        "`read_verified`, the chunk-verified copy a load reads where no lease can be had. Each sample a new "
        "process, interleaved with the floor, the file in the page cache.",
        "",
        "| size | read alone, ms median | leased mapping, ms median | ratio median (min) | copy, ms median | "
        "ratio median (min) | read + BLAKE3 apart |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in sizes:
        found = by_size[size]
        copy = found["blake3_chunks"]
        apart = found.get("floor_sum")
        summed = f"{apart.summary['ratio']['median']:.2f}x" if apart else "-"
        lines.append(
            f"| {size}B | {copy.summary['b']['ready_s']['median'] * 1e3:,.0f} | "
            f"{_ratio_cell(found.get('mapped_chunks'))} | {_ratio_cell(copy)} | {summed} |"
        )
    largest = by_size[sizes[-1]]["blake3_chunks"]
    big = largest.summary
    a_sys, a_user, b_sys = big["a"]["sys_s"]["median"], big["a"]["user_s"]["median"], big["b"]["sys_s"]["median"]
    cpu_ratio = (a_sys + a_user) / (b_sys + big["b"]["user_s"]["median"])
    size_bytes = largest.params["size_bytes"]
    variants = ", ".join(
        f"{f.name.split(', ', 1)[1]} {f.summary['ratio']['median']:.2f}x at {f.params['size']}B"
        for f in figures
        if f.a == "blake3_chunks" and "," in f.name
    )
    lines += [
        "",
        "![h200_verified_read_time.svg](performance/h200_verified_read_time.svg)",
        "![h200_verified_read_ratio.svg](performance/h200_verified_read_ratio.svg)",
        "",
        "The leased mapping meets the goal with room because it does less than the floor: the floor copies every "
        "byte from the page cache into a new buffer, and on this host that copy is the read's whole cost; the "
        "mapping hands the runtime the page cache's own pages, and hashing them on every core faults them in, so "
        f"the runtime then reads mapped memory{_read_pass_text(by_size[sizes[-1]], sizes[-1])}. It also holds no "
        "second copy of the engine in the process's memory. It is sound because of the lease: nobody can open the "
        "file for writing or truncate it without breaking it first, and the load checks the lease once the "
        "runtime is done (docs/security.md).",
        "",
        "The copy misses the goal because the read alone is bound by CPU, not by memory or disk. "
        f"At {sizes[-1]}B "
        f"its threads spend {b_sys:.1f} s in the kernel (page-cache copies, the buffer's huge pages faulted in) "
        f"in {big['b']['ready_s']['median']:.2f} s; the verified copy spends {a_sys:.1f} s there and {a_user:.1f} s "
        f"hashing (BLAKE3, {size_bytes / a_user / 1e9:.1f} GB/s per core). Its wall-clock ratio "
        f"({big['ratio']['median']:.2f}x) is its CPU ratio ({cpu_ratio:.2f}x): reading and hashing already overlap "
        "on every core, and what is left is the hashing itself, which no schedule hides while every core is busy "
        f"copying. Other chunk sizes, timed in the same run: {variants}; and in "
        "bench/results/verified_read_pieces_h200.json, hashing pieces of 4 MiB and 32 MiB instead of 1 MiB "
        "gave 1.27x-1.35x, pieces of 256 KiB and 128 KiB 1.9x-3.9x (each read and each hash of a piece gives the "
        "interpreter lock back and takes it again, and 16 threads queue on it). Where a GPU takes the engine, "
        "the device path above (kvikio, BLAKE3 on the GPU) meets its goal; where ONNX Runtime takes it on the "
        "CPU, the serving load reads it in place (Engine load, ONNX Runtime).",
    ]
    return "\n".join(lines)


SCALE_NOTES = """**Reading, verifying and pulling multi-GB engines** (issue 24). The figures live in their own
sections of this page, measured in the same run: chunk-verified reads of 10 MiB to 4 GiB against a parallel read plus a
parallel BLAKE3 done apart (Verified read, with its chart of cost against size); a 2 GB ORT engine's load against
`InferenceSession(path)` (Engine load, ONNX Runtime); pulls from the local S3 server against obstore's raw
parallel ranged download (its own section). Every blob over 32 MiB records a BLAKE3 digest per 32 MiB chunk
(`core.chunkdigests`): a read checks chunks on every core as they land, a pull fetches and checks them
independently and resumes at whole chunks, and a bad byte is named by its chunk."""


def run(report: Any) -> list[Figure]:
    rtx_preset = "0.1b" if report.quick else "1b"
    pairs = 2 if report.quick else 1
    scratch = Path(tempfile.mkdtemp(prefix="bench-llm-", dir=report.scratch))
    try:
        figures: list[Figure] = []
        notes: list[str] = []
        builds_by_preset: dict[str, list[str]] = {rtx_preset: ["rtx"]}
        builds_by_preset.setdefault(ORT_PRESET, []).append("ort")
        for preset, builds in builds_by_preset.items():
            made, note = _measure(report, scratch / preset, preset, builds, pairs)
            figures += made
            notes.append(note)
        report.section(
            SECTION,
            "A decoder in the Llama layout (RMSNorm, rotary attention with a KV cache and grouped-query heads, "
            "SwiGLU), random weights, built in a new process beside the same build by hand.",
            notes=_table(figures)
            + "\n\n"
            + "\n\n".join(notes)
            + ORT_LIMIT
            + "\n\n"
            + SCALE_NOTES
            + "\n\n"
            + device_table()
            + "\n\n"
            + host_table(),
        )
        return figures
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _measure(report: Any, scratch: Path, preset: str, builds: list[str], pairs: int) -> tuple[list[Figure], str]:
    model, template, written = _template(scratch, preset)
    model_bytes = sum(p.stat().st_size for p in model.parent.iterdir())
    python, child = sys.executable, str(BENCH / "llm_child.py")
    profiles = _profiles(preset)
    profile_options = [option for text in profiles for option in ("--profile", text)]
    params = {"preset": preset, "parameters": parameter_count(PRESETS[preset]), "model_bytes": model_bytes}
    commands = {
        "rtx": (
            Command(
                "enginecache build (rtx fp16)",
                [python, child, "product", str(template), MODEL, "rtx", "fp16", "--target", TARGET, *profile_options],
            ),
            Command("TensorRT-RTX by hand", [python, child, "raw-rtx", str(model), TARGET, *profiles]),
            f"TensorRT-RTX fp16, {preset}",
        ),
        "ort": (
            Command("enginecache build (ort)", [python, child, "product", str(template), MODEL, "ort", "fp32"]),
            Command("ONNX Runtime by hand", [python, child, "raw-ort", str(model)]),
            f"ONNX Runtime, {preset}",
        ),
    }
    figures = [
        report.compare(ours, floor, name=name, section=SECTION, pairs=pairs, warmup=0, params=params)
        for ours, floor, name in (commands[b] for b in builds)
    ]
    config = PRESETS[preset]
    note = (
        f"`{preset}` (tests/llamamodel.py): {parameter_count(config) / 1e9:.2f}B parameters ({config.layers} layers, "
        f"hidden {config.hidden}, {config.heads} heads / {config.kv_heads} KV heads, vocabulary {config.vocab}), fp16 "
        f"weights, {model_bytes / 2**30:.2f} GiB with its external data, written in {written:.0f} s."
    )
    return figures, note
