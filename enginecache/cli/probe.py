"""`enginecache ready --state FILE`: the readiness probe, answered before the Typer app is built.

A Kubernetes exec probe runs every few seconds for the life of a pod, so it must cost next to
nothing: this module imports the stdlib and `enginecache.service.serving.servestate` only (no Typer, no
command modules, no SQLAlchemy, no runtime), reads the serving state file that `load_or_build`
wrote after its verified load, and checks it (`servestate.check_state`: same boot, the process
still alive with the same start time, the engine blob's stat unchanged). Nothing is re-hashed, so
the cost does not grow with the engine's size.

`fast_main(argv)` answers exactly `[--home H] [--db URL] [-v] ready --state FILE [--json]` (the
catalog options are accepted and unused: the state file names everything) and returns the exit
code; anything else returns None and the caller builds the full CLI, where `ready --state` gives
the same answer more slowly. Wire it as the first line of `enginecache.cli.app.main()`:

    if (code := fast_main(sys.argv[1:])) is not None: sys.exit(code)

`python -m enginecache.cli.probe ready --state FILE` runs it alone (exit 2 for anything else).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_READY = 0
EXIT_NOT_READY = 1  # enginecache.errors.EXIT_FAILED, as `ready --model` exits
_GLOBAL_WITH_VALUE = ("--home", "--db")
_GLOBAL_FLAGS = ("-v", "--verbose")


def parse_probe_args(argv: Sequence[str]) -> tuple[Path, bool] | None:
    """(state file, --json) where argv is a state probe this module answers alone, else None."""
    args = list(argv)
    i = 0
    while i < len(args) and args[i] != "ready":
        word = args[i]
        if word in _GLOBAL_WITH_VALUE and i + 1 < len(args):
            i += 2
        elif word in _GLOBAL_FLAGS or ("=" in word and word.split("=", 1)[0] in _GLOBAL_WITH_VALUE):
            i += 1
        else:
            return None
    if i >= len(args):
        return None
    rest = args[i + 1 :]
    state: str | None = None
    as_json = False
    j = 0
    while j < len(rest):
        word = rest[j]
        if word == "--state" and j + 1 < len(rest) and state is None:
            state, j = rest[j + 1], j + 2
        elif word.startswith("--state=") and state is None:
            state, j = word.split("=", 1)[1], j + 1
        elif word == "--json":
            as_json, j = True, j + 1
        else:
            return None  # --model, --help, anything else: the full CLI
    return (Path(state), as_json) if state else None


def probe(state_file: Path, as_json: bool) -> int:
    """Check the serving state, print the verdict as `ready --model` does, return the exit code."""
    from enginecache.service.serving.servestate import check_state

    result = check_state(state_file)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(("ready: " if result.ready else "not ready: ") + result.reason)
    return EXIT_READY if result.ready else EXIT_NOT_READY


def fast_main(argv: Sequence[str]) -> int | None:
    """The state probe's exit code where argv is one, else None (build the full CLI)."""
    parsed = parse_probe_args(argv)
    if parsed is None:
        return None
    return probe(*parsed)


def main() -> None:
    """`python -m enginecache.cli.probe ready --state FILE [--json]`."""
    code = fast_main(sys.argv[1:])
    if code is None:
        print(
            "usage: python -m enginecache.cli.probe [--home H] [--db URL] ready --state FILE [--json]", file=sys.stderr
        )
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
