"""Charts of the committed 16-core H200 host figures, drawn here (no GPU needed) the way
bench/run_all.py draws `make bench`'s, so docs/performance.md shows the cost of a verified read
against size up to 13.5 GB beside the 2-core chart that stops at 4 GiB.

    python3 bench/gpu/h200_charts.py [--results FILE ...]

Reads the JSON files bench/gpu/host_read.py wrote on the GPU machine (by default the run with the
leased mapping, then the 4 GB and 13.5 GB run with its chunk-size variants, then the earlier 2 GB and
4 GB one; a figure named in an earlier file wins); writes docs/performance/h200_verified_read_time.svg
and h200_verified_read_ratio.svg.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_llm import HOST_RESULTS, HOST_SECTION, host_figures  # noqa: E402
from harness import Report  # noqa: E402
from run_all import DOCS, draw_charts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, nargs="+", default=HOST_RESULTS)
    args = parser.parse_args()
    report = Report(figures=host_figures(args.results))
    report.section(
        HOST_SECTION,
        "",
        charts=[
            {
                "file": "h200_verified_read_time.svg",
                "kind": "cost",
                "title": "16-core H200 host: time to a verified buffer, new process (median, min-max)",
                "x": "size_bytes",
                "x_label": "file size",
                "series": ["mapped_chunks", "blake3_chunks", "floor_pread", "floor_sum"],
                "y_scale": "linear",
            },
            {
                "file": "h200_verified_read_ratio.svg",
                "kind": "ratio",
                "title": "16-core H200 host: ratio to the read alone per pair; dashed: goal",
                "x": "size_bytes",
                "x_label": "file size",
            },
        ],
    )
    drawn = draw_charts(report, DOCS / "performance")
    print(f"wrote {', '.join(drawn.get(HOST_SECTION, []))} under {DOCS / 'performance'}", file=sys.stderr)


if __name__ == "__main__":
    main()
