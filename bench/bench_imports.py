"""The import diet: what each standard-library stand-in on the hit path saves a new process.

A cache hit must stay within 1.25x of loading the engine by hand (bench_start), whose floor imports
the runtime (onnxruntime, or tensorrt_rtx for the TensorRT-RTX verdict) and little else. enginecache
keeps a small stand-in for a standard-library module only where importing the module itself, on top of
what that floor already imports, would cost the hit a measurable share of its margin. Each figure
here is that cost, measured as the hit meets it: a new process importing the floor's runtime and then
the module, against one importing the runtime alone (interleaved pairs, the delta of the medians).

    .venv/bin/python bench/run_all.py --only bench_imports
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from harness import Command, Figure, installed_python  # noqa: E402

SECTION = "The import diet: what each stand-in saves a cache hit"
PAIRS = 15  # a few milliseconds against a start of 100-300 ms: more pairs than a ratio goal needs
RUNTIMES = {"onnxruntime": "ORT hit", "tensorrt_rtx": "TensorRT-RTX verdict"}
# The standard-library module, and what enginecache uses instead where a hit or a verdict runs.
STAND_INS = {
    "dataclasses": "core.valuetype (Frozen/Mutable: a dataclass's __init__, slots, eq, hash, replace)",
    "typing": "`TYPE_CHECKING = False` in the modules a hit imports (mypy reads the name as True)",
    "pathlib": "core.pathtext (absolute_text, resolved_text: the strings pathlib would give)",
    "importlib.util": "core.lazyimport (importable: sys.meta_path's finders, as find_spec asks them)",
    "importlib.metadata": "core.distributions (a distribution's version from its dist-info folder)",
    "logging": "a logger made on first use (a hit logs nothing)",
}


def _command(python: str, runtime: str, module: str | None) -> Command:
    code = f"import {runtime}" + (f"; import {module}" if module else "")
    return Command(f"import {runtime}" + (f", {module}" if module else ""), [python, "-c", code])


def _delta_ms(figure: Figure) -> tuple[float, float]:
    """Median and minimum of the per-pair differences, ours minus the floor, in ms."""
    deltas = [(a.wall_s - b.wall_s) * 1e3 for a, b in zip(figure.samples_a, figure.samples_b, strict=True)]
    return statistics.median(deltas), min(deltas)


def run(report: Any) -> list[Figure]:
    scratch = Path(tempfile.mkdtemp(prefix="bench-imports-", dir=report.scratch))
    try:
        return _measure(report, installed_python(scratch / "venv", BENCH.parent / "enginecache"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _measure(report: Any, python: str) -> list[Figure]:
    figures: list[Figure] = []
    rows = ["| module | enginecache's stand-in | " + " | ".join(f"after `import {r}`" for r in RUNTIMES) + " |"]
    rows.append("| --- | --- | " + " | ".join("---" for _ in RUNTIMES) + " |")
    cells: dict[str, list[str]] = {module: [] for module in STAND_INS}
    for runtime, label in RUNTIMES.items():
        floor = _command(python, runtime, None)
        candidates = [(_command(python, runtime, m), f"{m} after {runtime}", None, "") for m in STAND_INS]
        made = report.compare_many(
            floor, candidates, section=SECTION, pairs=PAIRS, params={"runtime": runtime, "label": label}
        )
        figures += made
        for module, figure in zip(STAND_INS, made, strict=True):
            median, low = _delta_ms(figure)
            cells[module].append(f"+{median:.1f} ms (min {low:+.1f})")
    rows += [f"| `{module}` | {STAND_INS[module]} | " + " | ".join(cells[module]) + " |" for module in STAND_INS]
    report.section(
        SECTION,
        "Each standard-library module a hit's own code avoids, imported in a new process after the floor's "
        "runtime, against the runtime alone: what the module would add to a cache hit (wall clock, interleaved).",
        notes="\n".join(rows)
        + "\n\nA stand-in stays only where its module would cost the hit a share of its margin: the ORT hit's "
        "floor is about 100-110 ms here, so 1.25x leaves 25-30 ms for the catalog lookup, the verified read and "
        "enginecache's own modules; the TensorRT-RTX verdict's margin was about 5 ms in the last full run. A "
        "module the runtime already imports costs nothing (about 0 ms above) and needs no stand-in.",
    )
    return figures
