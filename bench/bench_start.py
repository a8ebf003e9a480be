"""Benchmark: a serving process's start, each sample a NEW PROCESS, interleaved with its floor.

Figures (bench/harness.py: warm-up, then `pairs` interleaved pairs ours/floor, min and median,
per-pair ratio, CPU from rusage, load average around every run):

1. Cache hit: `load_or_build(model, spec=RuntimeSpec(backend="ort"), on_miss="fail")` in a new
   process (bench/start_child.py `hit`), ready when the session is in hand, against the floor a
   serving process without enginecache has: `import onnxruntime` and an `InferenceSession` of the
   stored engine file (`floor_ort`). The four shared models (../shared/models) and a synthetic
   1 GB model (an MLP of four 8192x8192 fp32 initializers in external data, made under the
   scratch folder and removed after; --quick: 256 MB). Goal 1.25x. This figure and the next run
   `HIT_PAIRS` (9) pairs, or `pairs` where that is more: their medians sit near the goal. Every
   engine is signed by a pool key the hits trust (`signing_env`: signature checks on, as a fleet
   runs them; the full path's first load leaves the receipt each hit finds), and one more row
   runs the first model's hit with no receipts kept (the Ed25519 check, `cryptography` imported,
   at every start) to show what the receipt saves.
2. TensorRT-RTX on a host without a supported GPU: the hit ends in EngineRejectedError
   INCOMPATIBLE; time to that verdict against `import tensorrt_rtx`, a Runtime, reading the engine
   file and `get_engine_validity` on its header (`floor_rtx`; ours verifies every byte before the
   header reaches the library). Goal 1.25x. Skipped where a GPU is present.
3. Host fingerprint: `host_fingerprint()` in a new process, with the NVML answer kept on disk and
   without (ENGINECACHE_HOST_CACHE=off), against the interpreter alone; goal: the fingerprint's
   own time (import + call, timed in the child) under 20 ms.
4. Readiness probe: `python -m enginecache.cli.probe ready --state FILE` (what `enginecache ready
   --state` runs before the Typer app) for serving states of a 10 MB, a 47 MB and a 1 GB engine
   held by this process, against `python -c pass`; goals 0.15 s wall and 0.1 CPU-s per call, flat
   in the engine's size. Beside it, the console script `enginecache ready --state` as it is wired now.
5. Phase breakdown of a new-process hit (interpreter start, import, fingerprint, lookup, validity,
   read_verify, deserialize, the rest) and of its floor (interpreter, import onnxruntime, session),
   medians per model: the section's `results` in the JSON, for a stacked-bar picture.

Every child (ours and floors alike) runs an interpreter that sees the checkout as a user's regular
install does (`harness.installed_python`: a venv linking our site-packages less an editable install's
finder, whose `.pth` would import pathlib, re, urllib.parse ... at every start); `--children editable`
runs them on this interpreter as it is, to measure that difference.

Run alone: `.venv/bin/python bench/bench_start.py [--quick] [--pairs 5] [--only hit,rtx,fingerprint,probe]
[--children installed|editable] [--out bench/results/start.json]`; or with every benchmark through
`make bench` (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from harness import Command, Figure, Report, installed_python  # noqa: E402
from start_phases import RTX, draw_phases, median, phase_breakdown  # noqa: E402

PY = sys.executable  # the children's interpreter: `run` sets an installed-like one (harness.installed_python)
CHILD = str(BENCH / "start_child.py")
SHARED = ROOT.parent / "shared" / "models"
MODELS = ("mobilenet_v3_small", "resnet18", "bert_mini", "tiny_llama")
HIT = "Serving start: cache hit"
PEAK_RSS_GOAL = 1.1  # the issue's: peak RSS of a hit at most 1.1x the floor's
FINGERPRINT = "Host fingerprint"
PROBE = "Readiness probe"
PHASES = "Serving start: where the time goes"
# Phases load_or_build times, in the order they run


# -- setup --------------------------------------------------------------------------------------


def make_big_model(folder: Path, size: int) -> Path:
    """An MLP of four square fp32 initializers totalling about `size` bytes, in external data."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    n = int((size / 4 / 4) ** 0.5) // 64 * 64
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "input"
    for i in range(4):
        inits.append(numpy_helper.from_array(rng.standard_normal((n, n), dtype=np.float32) * 0.01, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], ["output" if i == 3 else f"r{i}"]))
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", n])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "big.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="big.onnx.data")
    return path


def age(*paths: Path) -> None:
    """mtimes a minute back, so the stat cache entry is not racy (re-hashed on the next lookup)."""
    past = time.time() - 60
    for path in paths:
        os.utime(path, (past, past))


def build_catalog(home: Path, models: dict[str, Path], rtx: tuple[str, ...]) -> dict[tuple[str, str], Any]:
    """Register each model, build its ORT engine (and a TensorRT-RTX SM86 one for `rtx`), and load it
    once through the full path (stat cache entry and memo written). {(model, backend): engine row}."""
    from enginecache.errors import EngineRejectedError
    from enginecache.service.builds.plan import BuildRequest, build_engine
    from enginecache.service.context import AppContext
    from enginecache.service.models.register import register_model
    from enginecache.service.serving.runtime import RuntimeSpec, load_or_build

    app = AppContext.from_settings(home)
    engines: dict[tuple[str, str], Any] = {}
    for name, path in models.items():
        register_model(app, path, name=name)
        wanted = [("ort", ())] + ([("rtx", ("sm86",))] if name in rtx else [])
        for backend, targets in wanted:
            engine = build_engine(app, BuildRequest(model=name, backend=backend, targets=targets)).engine
            engines[(name, backend)] = engine
            with contextlib.suppress(
                EngineRejectedError
            ):  # TensorRT-RTX without a GPU: the memo is written all the same
                load_or_build(path, spec=RuntimeSpec(backend=backend, targets=targets), app=app, on_miss="fail").close()
    app.close()
    return engines


def signing_env(scratch: Path) -> dict[str, str]:
    """A pool key the builds sign with and the hits trust, with receipts in the scratch folder
    (core.signing): every hit figure is taken with signature checks on."""
    from enginecache.core.signing import RECEIPTS_ENV, SIGNING_KEY_ENV, TRUSTED_KEYS_ENV, generate_key

    private, public, _ = generate_key(scratch / "keys", "bench")
    return {SIGNING_KEY_ENV: private, TRUSTED_KEYS_ENV: public, RECEIPTS_ENV: str(scratch / "receipts")}


def has_gpu() -> bool:
    from enginecache.core.fingerprint import host_fingerprint

    return bool(host_fingerprint().gpus)


# -- figures ------------------------------------------------------------------------------------


# The serving start's figures are judged on a median ratio near its goal: with 5 pairs, the same code's
# median moved by up to 0.11x between two runs an hour apart (tiny_llama 1.21x, then 1.32x; 2026-12-02).
HIT_PAIRS = 9


def child(name: str, *args: str, env: dict[str, str]) -> Command:
    return Command(name, [PY, CHILD, *args], env=env)


def hit_figures(
    report: Report, models: dict[str, Path], engines: dict[tuple[str, str], Any], env: dict[str, str]
) -> None:
    from enginecache.core.signing import RECEIPTS_ENV

    home = Path(env["ENGINECACHE_HOME"])
    unreceipted = {**env, RECEIPTS_ENV: "off"}
    for name, path in models.items():
        engine = engines[(name, "ort")]
        report.compare(
            child("load_or_build hit (ort)", "hit", str(path), "ort", env=env),
            child("import onnxruntime + InferenceSession (floor)", "floor_ort", str(home / engine.blob_path), env=env),
            section=HIT,
            name=f"{name} ({engine.size_bytes / 1e6:,.0f} MB engine)",
            params={"model": name, "size_bytes": engine.size_bytes},
            goal_ratio=1.25,
            pairs=max(report.pairs, HIT_PAIRS),
        )
    name, path = next(iter(models.items()))
    engine = engines[(name, "ort")]
    report.compare(  # what the receipt saves: the Ed25519 check (cryptography imported) at every start
        child("load_or_build hit (ort), signature verified every start", "hit", str(path), "ort", env=unreceipted),
        child("import onnxruntime + InferenceSession (floor)", "floor_ort", str(home / engine.blob_path), env=env),
        section=HIT,
        name=f"{name}, no receipts",
        params={"model": name, "size_bytes": engine.size_bytes, "receipts": False},
        pairs=max(report.pairs, HIT_PAIRS),
    )


def rtx_figures(
    report: Report, models: dict[str, Path], engines: dict[tuple[str, str], Any], env: dict[str, str]
) -> None:
    home = Path(env["ENGINECACHE_HOME"])
    for name, path in models.items():
        engine = engines.get((name, "rtx"))
        if engine is None:
            continue
        report.compare(
            child("load_or_build hit (rtx) -> INCOMPATIBLE", "hit", str(path), "rtx", "sm86", env=env),
            child(
                "import tensorrt_rtx + read + get_engine_validity (floor)",
                "floor_rtx",
                str(home / engine.blob_path),
                env=env,
            ),
            section=RTX,
            name=f"{name} ({engine.size_bytes / 1e6:,.0f} MB engine)",
            params={"model": name, "size_bytes": engine.size_bytes},
            goal_ratio=1.25,
            pairs=max(report.pairs, HIT_PAIRS),
        )


def fingerprint_figures(report: Report, env: dict[str, str]) -> list[Figure]:
    noop = child("interpreter alone", "noop", env=env)
    return report.compare_many(
        noop,
        [
            (child("host_fingerprint, NVML answer kept", "fingerprint", env=env), "kept on disk", None, ""),
            (
                child("host_fingerprint, NVML asked", "fingerprint", env={**env, "ENGINECACHE_HOST_CACHE": "off"}),
                "NVML every process",
                None,
                "",
            ),
        ],
        section=FINGERPRINT,
        relation="peer",
    )


def serve_states(folder: Path, models: dict[str, Path], home: Path) -> tuple[list[Any], dict[str, Path]]:
    """Load each model's ORT engine in this process with a state file: this process is the server."""
    from enginecache.service.serving.runtime import RuntimeSpec, load_or_build

    held, states = [], {}
    for name, path in models.items():
        state = folder / f"{name}.state.json"
        held.append(load_or_build(path, spec=RuntimeSpec(backend="ort"), home=home, on_miss="fail", state_file=state))
        states[name] = state
    return held, states


def probe_figures(report: Report, states: dict[str, Path], sizes: dict[str, int], env: dict[str, str]) -> list[Figure]:
    # the checkout on the path: the editable install maps `enginecache` as a namespace outside it
    env = {**env, "PYTHONPATH": str(ROOT)}
    floor = Command("python -c pass", [PY, "-c", "pass"], env=env)
    script = Path(PY).with_name("enginecache")
    figures = []
    for name, state in states.items():
        candidates = [
            (
                Command(
                    "probe (python -m enginecache.cli.probe)",
                    [PY, "-m", "enginecache.cli.probe", "ready", "--state", str(state)],
                    env=env,
                ),
                f"{name} engine {sizes[name] / 1e6:,.0f} MB: fast dispatch",
                None,
                "",
            )
        ]
        if script.exists():
            candidates.append(
                (
                    Command(
                        "enginecache ready --state (console script)",
                        [str(script), "ready", "--state", str(state)],
                        env=env,
                    ),
                    f"{name} engine {sizes[name] / 1e6:,.0f} MB: console script",
                    None,
                    "as cli/app.py builds the Typer app today",
                )
            )
        figures += report.compare_many(
            floor, candidates, section=PROBE, relation="peer", params={"size_bytes": sizes[name]}
        )
    return figures


# -- run ----------------------------------------------------------------------------------------


NOTES = """\
How the hit gets there (docs/runtime.md, "A cache hit in a new process"): `enginecache.load_or_build` resolves lazily;
the hit path (`service.serving.hitpath`) reads the SQLite catalog with the stdlib's `sqlite3` in one read transaction
(stat cache row, the memo of this request's engine, the engine row, the model's READY engines), loads through
`service.serving.engineload` (the backend's header check; for ORT, the store file hashed where it lies under a read
lease and read by ONNX Runtime itself, `core.filelease`; for TensorRT, the leased file mapped read-only and hashed
from the mapping, `core.verifiedread.map_file`, or where no lease can be had one verified read into the `bytes` the
runtime takes) and records the event with one INSERT; it imports no SQLAlchemy, SQLModel, Alembic or onnx. The host
fingerprint reads /proc/cpuinfo's first block and the `.dist-info` folders directly and keeps NVML's answer on disk
per boot and driver.
A CPU backend's hit skips NVML. `via` in the phase results says which path every sample took (the memo is keyed by the
code too, so a source edit between samples sends one down the full path). A hit imports no `dataclasses` (its
values are `core.valuetype` classes) and only the backend it loads with (docs/runtime.md, "The import diet").
Children run as from a regular install (`harness.installed_python`): with the editable install's finder, every
start of ours and of the floors alike also imported pathlib, re, urllib.parse and ipaddress (`--children editable`):
`python -c pass` took 27-43 ms against 14-15 ms so (min of 15, load 3 on 2 cores; `-X importtime`: site 21 vs 3 ms).
"""


def held_at_ready(figures: list[Figure]) -> str:
    """Two lines per hit: the peak RSS of the whole start (the table's RSS ratio, against the goal:
    at most PEAK_RSS_GOAL the floor's) and the memory the serving process holds once ready (VmRSS,
    median), ours against the floor's."""
    peaks, lines = [], []
    for figure in figures:
        ours_peak, floor_peak = (
            median([s.maxrss_bytes for s in samples]) / 2**20 for samples in (figure.samples_a, figure.samples_b)
        )
        ratio = ours_peak / floor_peak
        verdict = "met" if ratio <= PEAK_RSS_GOAL else "**not met**"
        peaks.append(f"{figure.name}: {ours_peak:,.0f} MiB against {floor_peak:,.0f} MiB ({ratio:.3f}x: {verdict})")
        ours, floor = (
            median([s.extra["rss_ready_bytes"] for s in samples]) / 2**20
            for samples in (figure.samples_a, figure.samples_b)
        )
        lines.append(f"{figure.name}: {ours:,.0f} MiB against {floor:,.0f} MiB ({ours / floor:.2f}x)")
    peak = (
        f"\nPeak RSS of the start (VmHWM, median; goal at most {PEAK_RSS_GOAL}x the floor's): "
        + "; ".join(peaks)
        + ".\n"
    )
    return (
        peak + "\nMemory held once ready (VmRSS read right after the ready line, median): " + "; ".join(lines) + ".\n"
    )


def use_installed_python(scratch: Path) -> None:
    """Children start as from a user's regular install (`harness.installed_python`), with the console
    script beside that interpreter as pip would write it."""
    global PY
    PY = installed_python(scratch / "venv", ROOT / "enginecache")
    ours = Path(sys.executable).with_name("enginecache")
    if ours.exists():
        script = Path(PY).with_name("enginecache")
        body = ours.read_text().split("\n", 1)[1]
        script.write_text(f"#!{PY}\n{body}")
        script.chmod(0o755)


def run(report: Report) -> None:
    global PY
    only = set(report.options.get("start_only") or ("hit", "rtx", "fingerprint", "probe"))
    scratch = Path(tempfile.mkdtemp(prefix="bench-start-", dir=report.scratch))
    held: list[Any] = []
    signed: dict[str, str] = {}
    editable = report.options.get("start_children") == "editable"
    try:
        if not editable:
            use_installed_python(scratch)
        home = scratch / "home"
        signed = signing_env(scratch)
        os.environ.update(signed)  # this process's builds sign; its first loads leave the receipts
        env = {"ENGINECACHE_HOME": str(home), **signed}
        models = {name: SHARED / f"{name}.onnx" for name in MODELS if (SHARED / f"{name}.onnx").is_file()}
        big_size = 256 * 1024**2 if report.quick else 1024**3
        big = make_big_model(scratch / "big", big_size)
        age(big, big.with_name("big.onnx.data"))
        label = f"mlp_{big_size // 1024**2}MB"
        models[label] = big
        gpu = has_gpu()
        engines = build_catalog(home, models, () if gpu else ("mobilenet_v3_small", "resnet18"))
        sizes = {name: int(engines[(name, "ort")].size_bytes) for name in models}
        report.section(
            HIT,
            "A new process's `load_or_build` cache hit of an ORT engine, from spawn to the session in hand, against "
            "`import onnxruntime` + `InferenceSession(stored engine)`.",
            notes=NOTES,
            charts=[
                {
                    "file": "start_hit_ratio.svg",
                    "kind": "ratio",
                    "title": "New-process cache hit / floor per pair (median, min-max); dashed: goal",
                    "x": "size_bytes",
                    "x_label": "engine size",
                }
            ],
        )
        if "hit" in only:
            hit_figures(report, models, engines, env)
            report.sections[HIT]["notes"] = NOTES + held_at_ready([f for f in report.figures if f.section == HIT])
        if "rtx" in only and not gpu:
            report.section(
                RTX,
                "TensorRT-RTX engines on this GPU-less host: a new process's `load_or_build` ends in "
                "EngineRejectedError INCOMPATIBLE from the library's header check, made on the verified bytes "
                "(every byte is hashed before the header reaches the library); time to that verdict against "
                "`import tensorrt_rtx`, a Runtime, reading the file and `get_engine_validity` on its header.",
            )
            rtx_figures(report, {m: models[m] for m in ("mobilenet_v3_small", "resnet18") if m in models}, engines, env)
        if "fingerprint" in only:
            figures = fingerprint_figures(report, env)
            own = {f.name: median([s.extra["total_s"] for s in f.samples_a]) for f in figures}
            report.section(
                FINGERPRINT,
                "`host_fingerprint()` in a new process against the interpreter alone. Goal: its own time (import and "
                "call, timed inside the child) under 20 ms without a GPU. "
                + "; ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in own.items()),
            )
            report.sections[FINGERPRINT]["results"] = {
                "own_seconds_median": own,
                "goals_met": {f"{k} under 20 ms": v < 0.020 for k, v in own.items()},
            }
        if "probe" in only:
            held, states = serve_states(
                scratch, {m: models[m] for m in ("mobilenet_v3_small", "resnet18", label) if m in models}, home
            )
            figures = probe_figures(report, states, sizes, env)
            fast = [f for f in figures if "fast dispatch" in f.name]
            wall = {f.name: f.summary["a"]["wall_s"]["median"] for f in fast}
            cpu = {f.name: f.summary["a"]["cpu_s"]["median"] for f in fast}
            report.section(
                PROBE,
                "`enginecache ready --state FILE` against `python -c pass`, for serving states of engines of three "
                "sizes held by the benchmark process. Goals: at most 0.15 s wall and 0.1 CPU-s per call, flat in the "
                "engine's size.",
            )
            report.sections[PROBE]["results"] = {
                "wall_s_median": wall,
                "cpu_s_median": cpu,
                "goals_met": {
                    "wall <= 0.15 s": all(v <= 0.15 for v in wall.values()),
                    "cpu <= 0.1 s": all(v <= 0.10 for v in cpu.values()),
                },
            }
        hit_like = [f for f in report.figures if f.section in (HIT, RTX)]
        if hit_like:
            breakdown = phase_breakdown(hit_like)
            report.section(PHASES, "Median seconds per phase of the new-process hits above and of their floors.")
            report.sections[PHASES]["results"] = {"phases": breakdown}
            draw_phases(breakdown, ROOT / "docs" / "performance" / "start_phases.svg")
    finally:
        for loaded in held:
            loaded.close()
        for name in signed:
            os.environ.pop(name, None)
        shutil.rmtree(scratch, ignore_errors=True)
        PY = sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated: hit,rtx,fingerprint,probe")
    parser.add_argument(
        "--children",
        choices=("installed", "editable"),
        default="installed",
        help="children's interpreter: as from a regular install (default), or this one as it is",
    )
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "start.json")
    args = parser.parse_args()
    report = Report(quick=args.quick, pairs=args.pairs, scratch=args.scratch)
    report.options["start_children"] = args.children
    if args.only:
        report.options["start_only"] = [s.strip() for s in args.only.split(",") if s.strip()]
    load_before = os.getloadavg()
    run(report)
    payload = {
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "sections": report.sections,
        "figures": [f.to_dict() for f in report.figures],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
