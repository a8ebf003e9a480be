"""bench_start's phase breakdown: where a cache hit's time goes (`phase_breakdown`, from the phases
the hit children time themselves, median per phase), and its stacked-bar chart (`draw_phases`).
"""

from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from harness import Figure, Sample  # noqa: E402

RTX = "Serving start: TensorRT-RTX validity verdict"

HIT_PHASES = ("import_hitpath", "fingerprint", "lookup", "import_runtime", "validity", "read_verify", "deserialize")


# -- the phase breakdown ------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def phase_breakdown(figures: list[Figure]) -> dict[str, Any]:
    """Median seconds per phase of each hit figure's samples (and of its floor's)."""
    out: dict[str, Any] = {}
    for f in figures:
        rest = "validity" if f.section == RTX else "session"  # the floor's work after its import
        out[f"{'rtx' if f.section == RTX else 'ort'}: {f.name}"] = {
            "ours_s": _median_phases(f.samples_a, _hit_phases),
            "floor_s": _median_phases(f.samples_b, functools.partial(_floor_phases, rest)),
            "via": sorted({s.extra.get("via", "?") for s in f.samples_a}),
        }
    return out


def _median_phases(
    samples: list[Sample], phases: Callable[[float, dict[str, Any], float], dict[str, float]]
) -> dict[str, float]:
    """Median seconds per phase over the samples that timed themselves: `phases(ready_s, extra,
    inside)` names one sample's phases (`inside`: the child's own time, from its start to ready)."""
    values: dict[str, list[float]] = {}
    for s in samples:
        x = s.extra
        if not x or s.ready_s is None:
            continue
        for k, v in phases(s.ready_s, x, x["ready_at"] - x["t0"]).items():
            values.setdefault(k, []).append(v)
    return {k: median(v) for k, v in values.items()}


def _hit_phases(ready_s: float, x: dict[str, Any], inside: float) -> dict[str, float]:
    """A hit child's phases: the interpreter, enginecache's import, each phase it timed, the rest."""
    phases = x.get("phases") or {}
    known = {"interpreter": ready_s - inside, "import_enginecache": x["import_s"]}
    known.update({p: float(phases.get(p, 0.0)) for p in HIT_PHASES})
    known["other"] = max(0.0, inside - x["import_s"] - sum(float(v) for v in phases.values()))
    return known


def _floor_phases(rest: str, ready_s: float, x: dict[str, Any], inside: float) -> dict[str, float]:
    """A floor child's phases: the interpreter, the runtime's import, and `rest` (what it did then)."""
    return {"interpreter": ready_s - inside, "import_runtime": x["import_s"], rest: inside - x["import_s"]}


def draw_phases(breakdown: dict[str, Any], path: Path) -> None:
    """One pair of stacked bars per figure (ours above its floor), each as a share of the floor's
    median time (so a 10 MB and a 1 GB engine read alike), if matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(breakdown)
    fig, ax = plt.subplots(figsize=(8, 0.8 * len(names) + 1.6), dpi=100)
    colors: dict[str, Any] = {}
    for row, name in enumerate(names):
        floor_total = sum(breakdown[name]["floor_s"].values()) or 1.0
        for offset, side in ((0.2, "ours_s"), (-0.2, "floor_s")):
            left = 0.0
            for phase, seconds in breakdown[name][side].items():
                share = seconds / floor_total
                color = colors.setdefault(phase, plt.get_cmap("tab20")(len(colors) % 20))
                ax.barh(row + offset, share, left=left, height=0.36, color=color, label=phase)
                left += share
        ax.text(left + 0.01, row - 0.2, f"{floor_total * 1e3:,.0f} ms", va="center", fontsize=6)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.25, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(names)), [f"{n}\n(upper: ours, lower: floor)" for n in names], fontsize=7)
    ax.set_xlabel("share of the floor's median time (1 = the floor; dashed: the 1.25x goal)")
    ax.set_title("A new serving process's cache hit, phase by phase (medians)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(fig)
