"""The bench harness: time commands as a user meets them, each in a NEW PROCESS, beside its floor.

A figure compares command A (ours) with command B (its floor, or a peer) in one run: one warm-up of
each, then `pairs` interleaved pairs A B A B ... so drift and neighbours' load hit both alike. Each
child is started with `os.posix_spawn` by a small spawner process (see `_SPAWNER`: so that its
peak RSS is its own) and reaped with `os.wait4`, which gives its wall clock (spawn to exit), its
user and system CPU and its peak RSS (`ru_maxrss`) without any tool outside Python.

A child may also print `BENCH_JSON {...}` lines (phases it timed itself; kept as the sample's
`extra`) and one line `BENCH_READY <time.perf_counter()>` when what the user waits for
is ready (a buffer in hand, a service answering): `time.perf_counter` is CLOCK_MONOTONIC on Linux,
shared by every process, so spawn-to-ready is measured across the process boundary. That leaves
out interpreter teardown and unmapping the memory at exit, which a serving process never waits
for. Where every sample has it, spawn-to-ready is the figure's primary metric; spawn-to-exit is
kept beside it.

Reported per command: min / median / max of each metric; per pair: the ratio A/B with its min and
median; the 1-minute load average sampled around every run (the machine is shared: a figure that
ran at load 3 on 2 cores is not one that ran at load 0; our own child counts about 1); and the
machine (`machine_info`, bench/hostinfo.py).

Benchmark modules expose `run(report: Report) -> None` and call `report.compare(...)`; bench/run_all.py
finds them, runs them, writes bench/results/<date>.json and docs/performance.md.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack

from hostinfo import machine_info as machine_info  # re-exported: bench modules import it from here

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.installedpython import installed_python as installed_python  # re-exported, shared with the tests

READY_MARK = "BENCH_READY"
JSON_MARK = "BENCH_JSON"  # a child's own figures (phases it timed inside), one JSON object per line


@dataclass(frozen=True)
class Command:
    """One thing to time, as a user would start it: argv (a new process), optional env overrides."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Sample:
    """One run of one command."""

    wall_s: float  # spawn to exit, measured by the parent
    ready_s: float | None  # spawn to the child's BENCH_READY mark, when it printed one
    user_s: float
    sys_s: float
    maxrss_bytes: int
    load1: float  # 1-minute load average just before the run
    extra: dict[str, Any] = field(default_factory=dict)  # merged BENCH_JSON objects the child printed

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


class BenchError(RuntimeError):
    """A benchmark child failed; the message carries its exit status and the tail of its stderr."""


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


# The spawner: a bare interpreter (-I -S) that starts each child with os.posix_spawn and reaps
# it with os.wait4. Why not Popen from here: Linux carries the peak RSS of the address space a
# child was spawned from into the child's `ru_maxrss` across exec (posix_spawn and vfork run the
# child on the parent's memory until exec), so a child spawned by a benchmark process that once
# held a 64 MiB block reports at least that. The spawner stays near 10 MiB, less than any
# Python child, so the RSS figures are the children's own.
_SPAWNER = r"""
import json, os, sys, time
for line in sys.stdin:
    job = json.loads(line)
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_OPEN, 1, job["out"], os.O_WRONLY | os.O_TRUNC, 0),
               (os.POSIX_SPAWN_OPEN, 2, job["err"], os.O_WRONLY | os.O_TRUNC, 0)]
    load1 = os.getloadavg()[0]
    started = time.perf_counter()
    pid = os.posix_spawnp(job["argv"][0], job["argv"], job["env"], file_actions=actions)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - started
    print(json.dumps({"status": os.waitstatus_to_exitcode(status), "started": started, "wall": wall,
                      "user": usage.ru_utime, "sys": usage.ru_stime, "maxrss_kib": usage.ru_maxrss,
                      "load1": load1}), flush=True)
"""


class _Spawner:
    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SPAWNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, argv: Sequence[str], env: Mapping[str, str], out: str, err: str) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        job = {"argv": list(argv), "env": dict(env), "out": out, "err": err}
        self._process.stdin.write(json.dumps(job) + "\n")
        self._process.stdin.flush()
        reply = self._process.stdout.readline()
        if not reply:
            raise BenchError(f"the spawner died (exit status {self._process.wait()})")
        return dict(json.loads(reply))


_spawner: _Spawner | None = None
_pycache: str | None = None


def child_env(overrides: Mapping[str, str] | None) -> dict[str, str]:
    """The environment a child runs in: ours, with bytecode caching on (as installed code runs:
    pip byte-compiles packages) into a pycache prefix of the harness's own, so nothing is written
    into the checkout and a PYTHONDONTWRITEBYTECODE=1 in the caller's shell cannot make every
    sample recompile enginecache from source; then the command's own overrides."""
    global _pycache
    if _pycache is None:
        _pycache = tempfile.mkdtemp(prefix="bench-pycache-")
        atexit.register(shutil.rmtree, _pycache, True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = _pycache
    return {**env, **(overrides or {})}


def run_once(command: Command) -> Sample:
    """Run one command in a new process; its wall clock, CPU and peak RSS from `os.wait4`."""
    global _spawner
    if _spawner is None:
        _spawner = _Spawner()
    env = child_env(command.env)
    with tempfile.NamedTemporaryFile() as out_file, tempfile.NamedTemporaryFile() as err_file:
        done = _spawner.run(command.argv, env, out_file.name, err_file.name)
        out, err = Path(out_file.name).read_bytes(), Path(err_file.name).read_bytes()
    if done["status"] != 0:
        tail = err.decode(errors="replace")[-2000:]
        raise BenchError(f"{command.name}: exit status {done['status']}\n{tail}")
    ready: float | None = None
    extra: dict[str, Any] = {}
    for line in out.decode(errors="replace").splitlines():
        if line.startswith(READY_MARK + " "):
            ready = float(line.split()[1]) - done["started"]
        elif line.startswith(JSON_MARK + " "):
            extra.update(json.loads(line[len(JSON_MARK) + 1 :]))
    return Sample(
        wall_s=done["wall"],
        ready_s=ready,
        user_s=done["user"],
        sys_s=done["sys"],
        maxrss_bytes=done["maxrss_kib"] * 1024,  # kilobytes on Linux
        load1=done["load1"],
        extra=extra,
    )


@dataclass
class Figure:
    """Command A against its floor or peer B, interleaved in one run."""

    section: str
    name: str
    a: str
    b: str
    relation: str  # "floor" or "peer"
    params: dict[str, Any]
    goal_ratio: float | None
    metric: str  # "ready_s" or "wall_s"
    samples_a: list[Sample]
    samples_b: list[Sample]
    loadavg: dict[str, float]
    notes: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    def summarise(self) -> dict[str, Any]:
        def metric(s: Sample) -> float:
            value = getattr(s, self.metric)
            assert value is not None
            return float(value)

        ratios = [metric(x) / metric(y) for x, y in zip(self.samples_a, self.samples_b, strict=True)]
        ratios_exit = [x.wall_s / y.wall_s for x, y in zip(self.samples_a, self.samples_b, strict=True)]
        rss = [x.maxrss_bytes / y.maxrss_bytes for x, y in zip(self.samples_a, self.samples_b, strict=True)]
        per: dict[str, Any] = {}
        for label, samples in (("a", self.samples_a), ("b", self.samples_b)):
            per[label] = {
                self.metric: _stats([metric(s) for s in samples]),
                "wall_s": _stats([s.wall_s for s in samples]),
                "cpu_s": _stats([s.cpu_s for s in samples]),
                "user_s": _stats([s.user_s for s in samples]),
                "sys_s": _stats([s.sys_s for s in samples]),
                "maxrss_bytes": _stats([float(s.maxrss_bytes) for s in samples]),
            }
        self.summary = {
            "pairs": len(ratios),
            "ratio": {"per_pair": ratios, "min": min(ratios), "median": statistics.median(ratios)},
            "ratio_exit": {"min": min(ratios_exit), "median": statistics.median(ratios_exit)},
            "rss_ratio": {"min": min(rss), "median": statistics.median(rss), "max": max(rss)},
            "a": per["a"],
            "b": per["b"],
            "goal_met": None if self.goal_ratio is None else statistics.median(ratios) <= self.goal_ratio,
        }
        return self.summary

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("samples_a", "samples_b")}
        data["samples_a"] = [asdict(s) for s in self.samples_a]
        data["samples_b"] = [asdict(s) for s in self.samples_b]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Figure:
        """The figure `to_dict` wrote, samples included."""
        fields = {k: v for k, v in data.items() if k not in ("samples_a", "samples_b")}
        return cls(
            **fields,
            samples_a=[Sample(**s) for s in data["samples_a"]],
            samples_b=[Sample(**s) for s in data["samples_b"]],
        )


# What `compare_many` times against its one floor B: (command A, figure name, goal ratio or None, notes).
Candidate = tuple[Command, str, float | None, str]


class CompareOptions(TypedDict, total=False):
    """`compare_many`'s keywords beside the candidates; its defaults stand for those left out."""

    section: Required[str]
    pairs: int
    warmup: int
    relation: str
    params: Mapping[str, Any] | None
    progress: bool


def _figure(
    candidate: Candidate,
    b: Command,
    samples_a: list[Sample],
    samples_b: list[Sample],
    loads: list[float],
    *,
    section: str,
    relation: str,
    params: Mapping[str, Any] | None,
    progress: bool,
) -> Figure:
    a, name, goal_ratio, notes = candidate
    metric = "ready_s" if all(s.ready_s is not None for s in samples_a + samples_b) else "wall_s"
    loads = loads + [s.load1 for s in samples_a + samples_b]
    figure = Figure(
        section=section,
        name=name,
        a=a.name,
        b=b.name,
        relation=relation,
        params=dict(params or {}),
        goal_ratio=goal_ratio,
        metric=metric,
        samples_a=samples_a,
        samples_b=samples_b,
        loadavg={"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        notes=notes,
    )
    s = figure.summarise()
    if progress:
        goal = "" if goal_ratio is None else f" (goal x{goal_ratio:g}: {'met' if s['goal_met'] else 'NOT met'})"
        print(
            f"  {section} / {name}: {a.name} {s['a'][metric]['median'] * 1e3:9.1f} ms vs {relation} {b.name} "
            f"{s['b'][metric]['median'] * 1e3:9.1f} ms: x{s['ratio']['median']:.3f} (min x{s['ratio']['min']:.3f})"
            f"{goal}, RSS x{s['rss_ratio']['median']:.3f}, load {figure.loadavg['median']:.2f}",
            file=sys.stderr,
            flush=True,
        )
    return figure


def compare(
    a: Command,
    b: Command,
    *,
    name: str,
    goal_ratio: float | None = None,
    notes: str = "",
    **options: Unpack[CompareOptions],
) -> Figure:
    """Warm up each command, then run `pairs` interleaved pairs A B A B ...; a summarised Figure
    (`compare_many` with the one candidate A)."""
    return compare_many(b, [(a, name, goal_ratio, notes)], **options)[0]


def compare_many(
    b: Command,
    candidates: Sequence[Candidate],
    *,
    section: str,
    pairs: int = 5,
    warmup: int = 1,
    relation: str = "floor",
    params: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> list[Figure]:
    """Several commands against one floor B, interleaved round by round: A1 B A2 B ... .

    Each candidate (command, figure name, goal ratio or None, notes) is paired with the B run
    that follows it in the same round, so every pair ran back to back. One warm-up of each.
    """
    if pairs < 1:
        raise ValueError("pairs must be at least 1")
    for _ in range(warmup):
        for a, *_rest in candidates:
            run_once(a)
        run_once(b)
    loads: list[float] = [os.getloadavg()[0]]
    runs_a: list[list[Sample]] = [[] for _ in candidates]
    runs_b: list[list[Sample]] = [[] for _ in candidates]
    for _ in range(pairs):
        for i, (a, *_rest) in enumerate(candidates):
            runs_a[i].append(run_once(a))
            runs_b[i].append(run_once(b))
        loads.append(os.getloadavg()[0])
    return [
        _figure(
            candidate,
            b,
            runs_a[i],
            runs_b[i],
            loads,
            section=section,
            relation=relation,
            params=params,
            progress=progress,
        )
        for i, candidate in enumerate(candidates)
    ]


@dataclass
class Report:
    """What a benchmark module's `run(report)` gets: options, a scratch folder, and where figures go."""

    quick: bool = False
    pairs: int = 5
    scratch: Path = field(default_factory=lambda: Path("."))
    figures: list[Figure] = field(default_factory=list)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)  # title -> {"about": ..., "charts": [...]}
    options: dict[str, Any] = field(default_factory=dict)  # per-module knobs from the command line

    def section(self, title: str, about: str, *, notes: str = "", charts: Sequence[Mapping[str, Any]] = ()) -> None:
        """Describe a section for docs/performance.md: `about` goes above its table, `notes`
        (markdown: how it works, what limits it) below. `charts` are specs bench/run_all.py draws
        from the section's figures: {"file": "x.svg", "kind": "cost" | "ratio", "title": ...,
        "x": a numeric param, "x_label": ..., "series": [command names] and "y_scale": "log" (default) or
        "linear" (cost charts)}."""
        self.sections[title] = {"about": about, "notes": notes, "charts": [dict(c) for c in charts]}

    def compare(self, a: Command, b: Command, **kwargs: Any) -> Figure:
        """`compare` with this report's pair count; the figure is kept for the results."""
        kwargs.setdefault("pairs", self.pairs)
        figure = compare(a, b, **kwargs)
        self.figures.append(figure)
        return figure

    def compare_many(self, b: Command, candidates: Sequence[Candidate], **kwargs: Any) -> list[Figure]:
        """`compare_many` with this report's pair count; the figures are kept for the results."""
        kwargs.setdefault("pairs", self.pairs)
        figures = compare_many(b, candidates, **kwargs)
        self.figures.extend(figures)
        return figures
