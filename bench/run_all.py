"""Run every benchmark module in bench/ that exposes `run(report)`; write the results and the docs page.

    .venv/bin/python bench/run_all.py [--quick] [--pairs 5] [--only bench_read] [--no-docs]

A benchmark module is any bench/*.py with a top-level `def run(report)` (found by parsing, so
modules without one are never imported). It gets a `harness.Report` (quick flag, pair count,
a scratch folder it may write to and must clean) and records figures with `report.compare` /
`report.compare_many` and describes its section with `report.section`. Then:

- bench/results/<YYYY-MM-DD>.json: the machine, every figure with every sample;
- docs/performance/*.svg: the charts each section asked for (matplotlib, the `bench` extra);
- docs/performance.md: the machine, one table per section (ours, its floor or peer, the ratio per
  pair with min and median, RSS ratio, load average), the charts and the section's notes.

`make bench` runs this; `make bench QUICK=1` passes --quick (smaller sizes, fewer peers).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from harness import Figure, Report, Sample  # noqa: E402
from hostinfo import machine_info  # noqa: E402

RESULTS = BENCH / "results"
DOCS = ROOT / "docs"


def find_modules(names: list[str] | None = None) -> list[Path]:
    """bench/*.py files with a top-level `def run(report...)`, in name order."""
    found = []
    for path in sorted(BENCH.glob("*.py")):
        if path.name in ("harness.py", "run_all.py") or (names and path.stem not in names):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "run" and node.args.args:
                found.append(path)
                break
    return found


def load_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


# -- charts -------------------------------------------------------------------------------


def _size_label(n: float) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            value = n / scale
            return f"{value:g} {unit}" if value != int(value) else f"{int(value)} {unit}"
    return f"{int(n)} B"


def _series_points(figures: list[Figure], series: str, x: str) -> list[tuple[float, list[float]]]:
    """(x, the series' samples of the primary metric) per x, from the first figure that ran it."""
    points: dict[float, list[float]] = {}
    for f in figures:
        if x not in f.params:
            continue
        for name, samples in ((f.a, f.samples_a), (f.b, f.samples_b)):
            if name == series and f.params[x] not in points:
                points[float(f.params[x])] = [float(getattr(s, f.metric)) for s in samples]
    return sorted(points.items())


def draw_charts(report: Report, out_dir: Path) -> dict[str, list[str]]:
    """Draw every chart the sections asked for; {section title: [file names]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "enginecache", "svg.fonttype": "none", "font.size": 9})
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, list[str]] = {}
    for title, section in report.sections.items():
        figures = [f for f in report.figures if f.section == title]
        for spec in section["charts"]:
            fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
            x = spec["x"]
            xs_all: set[float] = set()
            if spec["kind"] == "cost":
                for series in spec["series"]:
                    pts = _series_points(figures, series, x)
                    if not pts:
                        continue
                    xs = [p[0] for p in pts]
                    med = [sorted(v)[len(v) // 2] * 1e3 for _, v in pts]
                    lo = [m - min(v) * 1e3 for m, (_, v) in zip(med, pts, strict=True)]
                    hi = [max(v) * 1e3 - m for m, (_, v) in zip(med, pts, strict=True)]
                    style: dict[str, Any] = {"linewidth": 1.4}
                    if "floor" in series:  # floors in black, the second one dashed
                        floors = [s for s in spec["series"] if "floor" in s]
                        style = {"linewidth": 2.4, "color": "black", "linestyle": "-" if series == floors[0] else "--"}
                    ax.errorbar(xs, med, yerr=[lo, hi], marker="o", markersize=4, capsize=3, label=series, **style)
                    xs_all.update(xs)
                scale = spec.get("y_scale", "log")  # "linear" where the sizes span less than a decade
                ax.set_yscale(scale)
                ax.set_ylabel("milliseconds, spawn to buffer ready" + (" (log)" if scale == "log" else ""))
            else:  # ratio per figure family (the figure name without its x label)
                families: dict[str, list[tuple[float, Figure]]] = {}
                for f in figures:
                    if x in f.params:
                        family = f.name.removeprefix(str(f.params.get("size", ""))).strip() or f.name
                        families.setdefault(family, []).append((float(f.params[x]), f))
                for family, pts in families.items():
                    pts.sort(key=lambda p: p[0])
                    xs = [p[0] for p in pts]
                    med = [p[1].summary["ratio"]["median"] for p in pts]
                    lo = [m - p[1].summary["ratio"]["min"] for m, p in zip(med, pts, strict=True)]
                    hi = [max(p[1].summary["ratio"]["per_pair"]) - m for m, p in zip(med, pts, strict=True)]
                    ax.errorbar(xs, med, yerr=[lo, hi], marker="o", markersize=4, capsize=3, label=family)
                    goals = [(px, p.goal_ratio) for px, p in pts if p.goal_ratio is not None]
                    if goals:
                        ax.step(
                            [g[0] for g in goals],
                            [g[1] for g in goals],
                            where="mid",
                            linestyle="--",
                            color="grey",
                            label=f"goal ({family})",
                        )
                    xs_all.update(xs)
                ax.axhline(1.0, color="black", linewidth=0.8)
                ax.set_yscale("log")
                low, high = ax.get_ylim()
                ticks_y = [t for t in (0.5, 0.75, 1, 1.15, 1.5, 2, 3, 5, 8, 12) if low <= t <= high]
                ax.set_yticks(ticks_y, [f"{t:g}x" for t in ticks_y])
                ax.set_ylabel("ours / floor per pair (log)")
            ax.set_xscale("log")
            ticks = sorted(xs_all)
            ax.set_xticks(ticks, [_size_label(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel(spec.get("x_label", x))
            ax.set_title(spec["title"])
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=7, loc="best")
            fig.tight_layout()
            fig.savefig(out_dir / spec["file"], metadata={"Date": None})
            plt.close(fig)
            drawn.setdefault(title, []).append(spec["file"])
    return drawn


# -- docs ---------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def _figure_row(f: Figure) -> str:
    s = f.summary
    metric = f.metric
    a, b = s["a"][metric], s["b"][metric]
    goal = "" if f.goal_ratio is None else f"≤ {f.goal_ratio:g}x: " + ("met" if s["goal_met"] else "**not met**")
    cpu = f"{s['a']['cpu_s']['median']:.2f} / {s['b']['cpu_s']['median']:.2f}"
    return (
        f"| {f.name} | {f.a} | {_ms(a['median'])} ({_ms(a['min'])}) | {f.b} | {_ms(b['median'])} ({_ms(b['min'])}) "
        f"| **{s['ratio']['median']:.2f}x** ({s['ratio']['min']:.2f}x) | {goal} | {s['rss_ratio']['median']:.3f}x "
        f"| {cpu} | {f.loadavg['median']:.2f} ({f.loadavg['min']:.2f}-{f.loadavg['max']:.2f}) |"
    )


def _shown(path: Path) -> str:
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def _gib(n: int | None) -> str:
    return "?" if not n else f"{n / 1024**3:.1f} GiB"


def _results_lines(results: Any) -> list[str]:
    """A section that files in-process results (a dict) instead of figures: its goals, then where the rest is."""
    lines: list[str] = []
    goals = results.get("goals_met") if isinstance(results, dict) else None
    if isinstance(goals, dict):
        lines += ["| goal | met |", "| --- | --- |"]
        lines += [f"| {goal} | {'yes' if met else '**no**'} |" for goal, met in goals.items()]
        lines.append("")
    source = results.get("source") if isinstance(results, dict) else None
    where = f"Figures from {source}" if source else "In-process figures (not new processes)"
    lines += [f"{where}: see this section's `results` in the JSON.", ""]
    return lines


def _damon(machine: dict[str, Any]) -> str:
    """What the machine's DAMON pages out (bench/hostinfo.py); results from before it was recorded say so."""
    if "damon_pageout" not in machine:
        return "not recorded"
    return str(machine["damon_pageout"] or "no pageout scheme")


def write_docs(
    report: Report,
    machine: dict[str, Any],
    charts: dict[str, list[str]],
    stamp: str,
    path: Path,
    failed: dict[str, str] | None = None,
    results: Path | None = None,
) -> None:
    disk = machine["disk"]
    libs = ", ".join(f"{k} {v}" for k, v in machine["libraries"].items() if v)
    lines = [
        "# Performance",
        "",
        f"Generated by `make bench` (bench/run_all.py) on {stamp}"
        + (" with `QUICK=1`" if report.quick else "")
        + f"; raw samples in `{_shown(results) if results else f'bench/results/{stamp[:10]}.json'}`."
        " Do not edit by hand: change the benchmark"
        " or its notes and run `make bench` again.",
        "",
        "How these figures are taken (bench/harness.py): every sample is a **new process** timed by the wall"
        " clock, from spawn to the moment what the user waits for is ready (the child prints a"
        " `BENCH_READY` mark; spawn-to-exit is in the JSON too). Ours and its floor run interleaved,"
        f" A B A B ..., after one warm-up of each, {report.pairs} pairs a figure (9 for the serving start's,"
        " whose medians sit near their goal); a ratio is taken per pair, so a neighbour's burst hits"
        " both sides of it. Tables give the median and, in brackets, the minimum; the min is what the"
        " code costs, the median what a user meets on this shared machine. CPU is user+sys of the child"
        " (ours / floor), RSS its peak (`ru_maxrss`, from `os.wait4`). The load average is the 1-minute"
        " figure sampled around every run: 2 cores, shared with other engineers, and our own child adds"
        " about 1.",
        "",
        "## Machine",
        "",
        "| what | value |",
        "| --- | --- |",
        f"| CPU | {machine['cpu_model']}, {machine['cores']} cores ({machine['cores_usable']} usable) |",
        f"| memory | {_gib(machine['memory_bytes'])} |",
        f"| disk of the work dir | {disk.get('device', '?')} ({disk.get('fs_type', '?')}) at"
        f" {disk.get('mount_point', '?')}, {_gib(disk['total_bytes'])}, {_gib(disk['free_bytes'])} free |",
        f"| kernel | {machine['kernel']}; transparent huge pages: `{machine['transparent_hugepage']}`; "
        f"DAMON: {_damon(machine)} |",
        f"| Python | {machine['python']} |",
        f"| libraries | {libs} |",
        "",
    ]
    for title, section in report.sections.items():
        figures = [f for f in report.figures if f.section == title]
        lines += [f"## {title}", "", section["about"], ""]
        if section.get("generated") and section["generated"] != stamp:
            lines += [
                f"(Figures of {section['generated']}, from an earlier run of {section.get('module', 'its module')}.)",
                "",
            ]
        if not figures:
            if "results" in section:
                lines += _results_lines(section["results"])
            if section.get("notes"):
                lines += [section["notes"].strip(), ""]
            continue
        lines += [
            "| figure | ours | ours ms median (min) | against | theirs ms median (min) | ratio median (min) | goal "
            "| RSS ratio | CPU s ours / theirs | load avg median (range) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_figure_row(f) for f in figures]
        lines.append("")
        for name in charts.get(title, []):
            lines += [f"![{name}](performance/{name})", ""]
        if section.get("notes"):
            lines += [section["notes"].strip(), ""]
    for name in failed or {}:
        lines += [f"**{name} failed in this run**; its traceback is under `failed` in the JSON.", ""]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


README_BEGIN = "<!-- bench:glance:begin (written by bench/run_all.py from the newest results) -->"
README_END = "<!-- bench:glance:end -->"


def write_readme_glance(report: Report, stamp: str, readme: Path) -> bool:
    """Replace the block between the README's markers with every figure that has a goal (ours, its
    floor, the ratio, the goal and whether it was met), so no README figure is quoted by hand."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        return False
    rows = [
        f"Figures of `make bench` on {stamp}"
        + (" (`QUICK=1`)" if report.quick else "")
        + ", new processes beside their floor, interleaved (docs/performance.md has every figure):",
        "",
        "| figure | ours ms median | floor ms median | ratio median (min) | goal |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in report.figures:
        if f.goal_ratio is None:
            continue
        s = f.summary
        met = "met" if s["goal_met"] else "**not met**"
        rows.append(
            f"| {f.section}: {f.name} | {_ms(s['a'][f.metric]['median'])} | {_ms(s['b'][f.metric]['median'])} "
            f"| {s['ratio']['median']:.2f}x ({s['ratio']['min']:.2f}x) | ≤ {f.goal_ratio:g}x: {met} |"
        )
    head, rest = text.split(README_BEGIN, 1)
    _old, tail = rest.split(README_END, 1)
    readme.write_text(head + README_BEGIN + "\n" + "\n".join(rows) + "\n" + README_END + tail)
    return True


def load_results(path: Path) -> tuple[Report, dict[str, Any], str, dict[str, str]]:
    """A results JSON back into a Report (figures with their samples), for --from-results."""
    data = json.loads(path.read_text())
    report = Report(quick=data["quick"], pairs=data["pairs"])
    report.sections = data["sections"]
    for raw in data["figures"]:
        fields = {k: v for k, v in raw.items() if k not in ("samples_a", "samples_b")}
        figure = Figure(
            **fields,
            samples_a=[Sample(**s) for s in raw["samples_a"]],
            samples_b=[Sample(**s) for s in raw["samples_b"]],
        )
        figure.summarise()
        report.figures.append(figure)
    return report, data["machine"], data["generated"], data.get("failed", {})


def keep_earlier_sections(report: Report, results: Path, ran: set[str]) -> None:
    """An --only run keeps the sections of the modules it did not run from the same results file,
    so the page still shows every benchmark (each section says when its figures were taken)."""
    earlier, _machine, _stamp, _failed = load_results(results)
    for title, section in earlier.sections.items():
        if title in report.sections or section.get("module") in ran:
            continue
        report.sections[title] = section
        report.figures += [f for f in earlier.figures if f.section == title]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer peers (still 5 pairs)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated module names, e.g. bench_read")
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--results", type=Path, default=None, help="default bench/results/<date>.json")
    parser.add_argument("--docs", type=Path, default=DOCS / "performance.md")
    parser.add_argument("--no-docs", action="store_true", help="write the JSON only")
    parser.add_argument("--from-results", type=Path, default=None, help="redraw the docs from a results JSON")
    args = parser.parse_args()
    if args.from_results is not None:
        report, machine, stamp, failed = load_results(args.from_results)
        charts = draw_charts(report, args.docs.parent / "performance")
        write_docs(report, machine, charts, stamp, args.docs, failed, args.from_results.resolve())
        write_readme_glance(report, stamp, ROOT / "README.md")
        print(f"wrote {args.docs} and the README's figures from {args.from_results}", file=sys.stderr)
        return
    if args.pairs < 5:
        print("note: fewer than 5 pairs is below the project's standard", file=sys.stderr)
    started = time.time()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = machine_info(args.scratch)
    report = Report(quick=args.quick, pairs=args.pairs, scratch=args.scratch)
    modules = find_modules([n.strip() for n in args.only.split(",") if n.strip()] or None)
    failed: dict[str, str] = {}
    for path in modules:
        print(f"{path.name}:", file=sys.stderr, flush=True)
        before = set(report.sections)
        try:
            load_module(path).run(report)
        except Exception:  # noqa: BLE001 - one failed benchmark must not lose the others' figures
            failed[path.name] = traceback.format_exc()
            print(failed[path.name], file=sys.stderr, flush=True)
        for title in set(report.sections) - before:
            report.sections[title].update(module=path.name, generated=stamp)
    machine["loadavg_at_end"] = list(os.getloadavg())
    # A quick run does not replace the day's full figures.
    results = args.results or RESULTS / f"{stamp[:10]}{'-quick' if report.quick else ''}.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    if args.only and results.exists():
        keep_earlier_sections(report, results, {p.name for p in modules})
    payload = {
        "generated": stamp,
        "quick": report.quick,
        "pairs": report.pairs,
        "duration_s": math.ceil(time.time() - started),
        "modules": [p.name for p in modules],
        "machine": machine,
        "sections": report.sections,
        "figures": [f.to_dict() for f in report.figures],
        "failed": failed,
    }
    results.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {_shown(results)}", file=sys.stderr)
    if not args.no_docs:
        chart_dir = args.docs.parent / "performance"  # the page links its charts as performance/<file>
        charts = draw_charts(report, chart_dir)
        write_docs(report, machine, charts, stamp, args.docs, failed, results)
        print(f"wrote {args.docs} and {sum(len(v) for v in charts.values())} charts in {chart_dir}", file=sys.stderr)
        if not args.only and write_readme_glance(report, stamp, ROOT / "README.md"):  # a whole run only
            print("wrote the README's figures", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
