"""Host figure on the GPU machine (16 cores): the chunk-verified read against the parallel read alone.

    python3 bench/gpu/host_read.py --out $OUT/verified_read_h200.json [--sizes 2G,4G] [--pairs 5]

Issue 24's goal for a host with many cores: `read_verified` with the chunk digests a catalog row
records (bench/read_child.py `blake3_chunks`, what a cache hit does) at most 1.2x positioned reads of
the same file on every core into the same kind of buffer with no hashing (`floor_pread`). Also
timed against the parallel read plus a parallel BLAKE3 done apart (`floor_sum`, the 2-core floor of
bench/bench_read.py). Every sample a new process, interleaved with the floor, files in the page
cache; blake3 comes from the carried wheel (PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GOAL = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="2G,4G")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()

    from bench_read import CHILD, make_file, parse_size
    from harness import Command, compare_many
    from hostinfo import machine_info

    from enginecache.core.hashing import hash_file

    def child(mode: str, path: Path, digest: str = "") -> Command:
        return Command(mode, [sys.executable, str(CHILD), mode, str(path)] + ([digest] if digest else []))

    work = Path(tempfile.mkdtemp(prefix="host-read-"))
    result: dict[str, object] = {"what": "chunk-verified read vs the parallel read alone", "goal_ratio": GOAL}
    result["machine"] = machine_info(work)
    rows = []
    try:
        for label in [s.strip() for s in args.sizes.split(",") if s.strip()]:
            size = parse_size(label)
            path = work / f"engine-{label}.bin"
            make_file(path, size)
            digest = hash_file(path)
            chunked = f"{digest.blake3}/{digest.chunk_blake3}"
            figures = compare_many(
                child("floor_pread", path),
                [
                    (child("blake3_chunks", path, chunked), f"{label} chunk-verified vs read alone", GOAL, ""),
                    (child("floor_sum", path, digest.blake3), f"{label} read + BLAKE3 apart vs read alone", None, ""),
                ],
                section="verified read, 16-core host",
                pairs=args.pairs,
                params={"size": label, "size_bytes": size},
            )
            rows += [figure.to_dict() for figure in figures]
            path.unlink()
    finally:
        for leftover in work.glob("*"):
            leftover.unlink()
        work.rmdir()
    result["figures"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
