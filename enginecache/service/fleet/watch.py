"""Use case: `enginecache pull MODEL@ALIAS --dest DIR --watch`: a sidecar that keeps a pulled folder on
the engine the alias points at, so a promote or a rollback reaches running serving pods.

Each round re-resolves the reference (an alias resolves afresh, for this host's GPU class) and runs
`service.fleet.pull.pull`: a moved alias means a new engine is copied beside the old one (blobs are
content-addressed, so the old blob stays where the serving process reads it) and verified in full,
and only then is the manifest replaced, atomically. The replaced manifest is the notice to the
serving process: it polls the manifest (`service.serving.follow.PulledFollower.poll`), loads the new
engine beside the old one and switches, or keeps the old one serving where the new one fails to load.
With a disk budget the old blob is not evicted while a live process has it loaded (`core.diskbudget`).

A round that fails (catalog or store unreachable, no engine fits, a blob that does not match its
digest) leaves the manifest as it was, so the serving process keeps what it has; the round's error
is reported and the next round tries again. A bad argument or an unknown model on the first round is
raised: nothing would ever come of waiting.

Rounds are separated by `wait()` (the CLI's waits `--interval` seconds; a test passes its own, so
rounds are driven, not timed); `rounds=None` runs until interrupted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.errors import BadInputError, EngineCacheError, NotFoundError
from enginecache.service.context import AppContext
from enginecache.service.fleet.profiles import Wanted
from enginecache.service.fleet.pull import PullResult, pull


@dataclass(frozen=True)
class WatchRound:
    round: int  # 1, 2, ...
    result: PullResult | None  # None where the round failed
    error: str | None = None  # why it failed; the manifest was left as it was

    @property
    def switched(self) -> bool:
        """Whether this round replaced the manifest (a new engine, or a repaired copy)."""
        return self.result is not None and not self.result.up_to_date

    def to_dict(self) -> dict[str, Any]:
        pulled = {} if self.result is None else self.result.to_dict()
        return {"round": self.round, "switched": self.switched, "error": self.error, **pulled}


def watch(
    app: AppContext,
    model_ref: str | int,
    dest: Path,
    *,
    wait: Callable[[], object],
    rounds: int | None = None,
    wanted: Wanted | None = None,
    host: HostFingerprint | None = None,
    max_bytes: int | None = None,
    on_round: Callable[[WatchRound], None] | None = None,
) -> list[WatchRound]:
    """Pull `model_ref` into `dest` round after round (module docstring), calling `wait()` between
    rounds and `on_round` after each; the rounds run (kept only where `rounds` is given, so an
    endless watch holds nothing). Raises BadInputError or NotFoundError from the first round."""
    if rounds is not None and rounds < 1:
        raise BadInputError(f"--rounds must be 1 or more, not {rounds}")
    host = host or host_fingerprint()
    done: list[WatchRound] = []
    number = 0
    while rounds is None or number < rounds:
        if number:
            wait()
        number += 1
        try:
            outcome = WatchRound(number, pull(app, model_ref, dest, wanted=wanted, host=host, max_bytes=max_bytes))
        except (BadInputError, NotFoundError) as err:
            if number == 1:
                raise
            outcome = WatchRound(number, None, str(err))  # a model removed since the first round
        except EngineCacheError as err:
            outcome = WatchRound(number, None, str(err))
        if on_round is not None:
            on_round(outcome)
        if rounds is not None:
            done.append(outcome)
    return done
