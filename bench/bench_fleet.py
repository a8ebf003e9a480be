"""The fleet simulation's figures: the build pool's throughput and the takeover time of a cut-off host.

Runs tests/test_fleet_netns.py (six hosts as network namespaces, a PostgreSQL catalog and an S3
server on the bridge, 200 real TensorRT-RTX builds through 4 workers, one worker host's link cut
mid-build) in a new process, as the suite does, and reads the figures it writes to
$ENGINECACHE_FLEET_REPORT. Needs root (network namespaces) and PostgreSQL; where either is missing the
test says why and this section says so.

    .venv/bin/python bench/bench_fleet.py        # prints the figures as JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SECTION = "Fleet simulation (network namespaces)"
TEST = "tests/test_fleet_netns.py"
TIMEOUT_SECONDS = 1800


def measure(scratch: Path | None = None) -> dict[str, Any]:
    """Run the simulation once; its figures, or {"error": why} where it did not run."""
    with tempfile.TemporaryDirectory(prefix="enginecache-bench-fleet-", dir=scratch) as tmp:
        out = Path(tmp) / "fleet.json"
        env = {**os.environ, "ENGINECACHE_FLEET_REPORT": str(out), "CI": os.environ.get("CI", "")}
        argv = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs", TEST]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            return {"error": f"{TEST} exited {done.returncode}: " + " | ".join(tail)}
        figures: dict[str, Any] = json.loads(out.read_text())
        return {**figures, "source": f"one run of {TEST} (hosts are new processes in network namespaces)"}


def _notes(figures: dict[str, Any]) -> str:
    if "error" in figures:
        return f"Not measured: {figures['error']}"
    starts = figures.get("serving_start_seconds", {})
    rows = [
        "| figure | value |",
        "| --- | --- |",
        f"| build jobs through the pool | {figures['jobs']} on {figures['workers']} worker hosts |",
        f"| pool wall time (submit to last job done) | {figures['pool_seconds']} s |",
        f"| throughput | {figures['jobs_per_second']} jobs/s |",
        f"| takeover (link cut to another host holding the job) | {figures['takeover_seconds']} s "
        f"(lease {figures['lease_seconds']:g} s) |",
    ]
    rows += [f"| serving start on {host} (new process, pulled folder) | {s} s |" for host, s in starts.items()]
    return "\n".join(rows) + (
        "\n\nThe takeover is bounded by the lease: at most one lease after the cut (plus a claim poll); "
        "the serving host whose link is cut starts from what it pulled, its load event unwritten."
    )


def run(report: Any) -> dict[str, Any]:
    """bench/run_all.py's entry point: one run of the simulation, filed as the section's results."""
    figures = measure(getattr(report, "scratch", None))
    report.section(
        SECTION,
        "200 real TensorRT-RTX builds through 4 worker hosts (Linux network namespaces on one bridge, "
        "a PostgreSQL catalog and an S3 server at the bridge's address), one worker host cut off "
        f"mid-build, then 2 serving hosts pull and start ({TEST}).",
        notes=_notes(figures),
    )
    report.sections[SECTION]["results"] = figures
    return figures


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
