"""Host figure on the GPU machine (16 cores): the chunk-verified read against the parallel read alone.

    python3 bench/gpu/host_read.py --out $OUT/verified_read_h200.json [--sizes 2G,4G] [--pairs 5]
        [--variants 32:1024,8:256]

Issue 24's goal for a host with many cores: a verified read with the chunk digests a catalog row
records at most 1.2x positioned reads of the same file on every core into a buffer with no hashing
(`floor_pread`). Two of ours: the leased mapping a load hands a runtime that deserializes from
memory (bench/read_child.py `mapped_chunks`: the store file mapped read-only under a read lease, each
chunk hashed from the mapping on every core), and `read_verified` into a new buffer (`blake3_chunks`,
where no lease can be had). Also
timed against the parallel read plus a parallel BLAKE3 done apart (`floor_sum`, the 2-core floor of
bench/bench_read.py). Every sample a new process, interleaved with the floor, files in the page
cache; blake3 comes from the carried wheel (PYTHONPATH). `--variants` times the read with other
chunk sizes (MiB; a row records its chunk size, the product writes CHUNK_DIGEST_BYTES) and pieces
(KiB; verifiedread.HASH_PIECE_BYTES): a thread hashes a chunk in order, so the last chunks in flight
set how long the read waits for its slowest thread, and a smaller piece is likelier still in the
core's L2 cache when it is hashed.
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
    parser.add_argument("--variants", default="", help="CHUNK_MIB:PIECE_KIB,... to time (default: the product's)")
    args = parser.parse_args()

    from bench_read import CHILD, make_file, parse_size
    from harness import Command, compare_many
    from hostinfo import machine_info

    from enginecache.core.chunkdigests import CHUNK_DIGEST_BYTES
    from enginecache.core.hashing import hash_file
    from enginecache.core.verifiedread import HASH_PIECE_BYTES

    def child(mode: str, path: Path, digest: str = "", piece_bytes: int = HASH_PIECE_BYTES) -> Command:
        env = {"BENCH_READ_PASS": "1"}  # then one pass over the buffer on one thread, timed apart
        if piece_bytes != HASH_PIECE_BYTES:
            env["BENCH_HASH_PIECE_BYTES"] = str(piece_bytes)
        argv = [sys.executable, str(CHILD), mode, str(path)] + ([digest] if digest else [])
        return Command(mode, argv, env=env)

    variants = [
        (int(chunk) * 2**20, int(piece) * 2**10)
        for chunk, _, piece in (v.strip().partition(":") for v in args.variants.split(",") if v.strip())
    ]
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
            verified = [
                (
                    child("mapped_chunks", path, f"{digest.blake3}/{chunk_list(path, CHUNK_DIGEST_BYTES)}"),
                    f"{label} leased mapping vs read alone",
                    GOAL,
                    "",
                )
            ]
            for chunk_bytes, piece_bytes in variants or [(CHUNK_DIGEST_BYTES, HASH_PIECE_BYTES)]:
                chunked = f"{digest.blake3}/{chunk_list(path, chunk_bytes)}"
                name = f"{label} chunk-verified vs read alone"
                if (chunk_bytes, piece_bytes) != (CHUNK_DIGEST_BYTES, HASH_PIECE_BYTES):
                    name += f", {chunk_bytes // 2**20} MiB chunks, {piece_bytes // 2**10} KiB pieces"
                verified.append((child("blake3_chunks", path, chunked, piece_bytes), name, GOAL, ""))
            figures = compare_many(
                child("floor_pread", path),
                [
                    *verified,
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


def chunk_list(path: Path, chunk_bytes: int) -> str:
    """The encoded chunk digests of the file at `path` cut into `chunk_bytes` chunks."""
    import blake3

    from enginecache.core.chunkdigests import ChunkDigests

    digests = []
    with open(path, "rb", buffering=0) as stream:
        while block := stream.read(chunk_bytes):
            digests.append(blake3.blake3(block, max_threads=blake3.blake3.AUTO).hexdigest())
    return ChunkDigests(chunk_bytes, tuple(digests)).encode()


if __name__ == "__main__":
    main()
