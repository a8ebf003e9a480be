"""`pull --watch`: each round re-resolves the alias; a promote or a rollback pulls the engine it points at
beside the old one and replaces the manifest, which a serving process (`PulledFollower`) follows,
rewriting its readiness state; a new engine that fails to load keeps the old one serving. Rounds are
driven by the test's own `wait`, never timed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from enginecache.core.blobpaths import blob_path
from enginecache.errors import NotFoundError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.fleet.pull import manifest_path
from enginecache.service.fleet.watch import watch
from enginecache.service.models.register import register_model
from enginecache.service.models.releases import promote, rollback
from enginecache.service.serving.follow import PulledFollower
from tests.clirunner import run_cli
from tests.conftest import corrupt_blob
from tests.modelfactory import make_mlp


@pytest.fixture
def versions(app_ctx: AppContext, tmp_path: Path) -> dict[int, str]:
    """Two versions of `mlp`, an ORT engine each; `prod` at version 1. Version -> engine sha256."""
    shas = {}
    for version in (1, 2):
        path = make_mlp(tmp_path / f"mlp-v{version}.onnx", seed=version)
        model = register_model(app_ctx, path, name="mlp", new_version=version > 1).model
        built = build_engine(app_ctx, BuildRequest(model=str(model.id), backend="ort", precision="fp16")).engine
        shas[version] = str(built.sha256)
    promote(app_ctx, "mlp", "prod", version=1)
    return shas


def _state_blob(state: Path) -> str:
    return str(json.loads(state.read_text())["engine"]["blob"])


def test_a_promote_and_a_rollback_reach_the_serving_process_round_by_round(
    app_ctx: AppContext, versions: dict[int, str], tmp_path: Path
) -> None:
    dest, state = tmp_path / "engines", tmp_path / "state.json"
    moves: Iterator[Callable[[], object]] = iter(
        [lambda: promote(app_ctx, "mlp", "prod", version=2), lambda: rollback(app_ctx, "mlp", "prod")]
    )
    rounds = watch(app_ctx, "mlp@prod", dest, rounds=1, wait=lambda: None)
    assert rounds[0].switched and rounds[0].result is not None and rounds[0].result.sha256 == versions[1]
    follower = PulledFollower(manifest_path(dest, "mlp"), state_file=state)
    try:
        assert follower.sha256 == versions[1] and follower.poll() == "unchanged"
        first_blob = _state_blob(state)

        def serve_and_move() -> None:  # between rounds: the server polls, then the alias moves
            follower.poll()
            next(moves)()

        done = watch(app_ctx, "mlp@prod", dest, rounds=3, wait=serve_and_move)
        assert [r.switched for r in done] == [False, True, True]
        assert [r.result.sha256 for r in done if r.result] == [versions[1], versions[2], versions[1]]
        # the last round (the rollback) is not polled yet: one poll switches back
        assert follower.sha256 == versions[2] and follower.switches == 1
        assert blob_path(dest, versions[2]).is_file() and blob_path(dest, versions[1]).is_file(), "side by side"
        assert follower.poll() == "switched" and follower.sha256 == versions[1] and follower.switches == 2
        assert _state_blob(state) == first_blob, "the readiness state names the engine served"
        assert follower.poll() == "unchanged"
    finally:
        follower.close()
    assert not state.exists(), "close removes the serving state"


def test_a_new_engine_that_fails_to_load_keeps_the_old_one_serving(
    app_ctx: AppContext, versions: dict[int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest, state = tmp_path / "engines", tmp_path / "state.json"
    watch(app_ctx, "mlp@prod", dest, rounds=1, wait=lambda: None)
    follower = PulledFollower(manifest_path(dest, "mlp"), state_file=state)
    try:
        old_state = state.read_text()
        promote(app_ctx, "mlp", "prod", version=2)
        assert watch(app_ctx, "mlp@prod", dest, rounds=1, wait=lambda: None)[0].switched
        corrupt_blob(blob_path(dest, versions[2]))  # the new copy damaged after the pull verified it
        assert follower.poll() == "kept"
        assert follower.sha256 == versions[1] and follower.last_error and "CORRUPT" in follower.last_error
        assert state.read_text() == old_state, "the readiness state still names the old engine"
        ready = run_cli(capsys, "ready", "--state", str(state))
        assert ready.code == 0, ready.out + ready.err
        out = follower.engine.infer({"input": np.ones((1, 16), dtype=np.float32)})
        assert next(iter(out.values())).shape[0] == 1, "the old engine still answers"
        assert follower.poll() == "unchanged", "the same failed manifest is not retried"
        # the next round finds the damaged copy, copies it again and replaces the manifest: now it switches
        assert watch(app_ctx, "mlp@prod", dest, rounds=1, wait=lambda: None)[0].switched
        assert follower.poll() == "switched" and follower.sha256 == versions[2] and follower.last_error is None
    finally:
        follower.close()


def test_the_cli_watch_runs_its_rounds_and_an_unknown_model_is_refused_at_once(
    app_ctx: AppContext, versions: dict[int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "engines"
    cli = ["--home", str(app_ctx.home), "--db", app_ctx.db_url, "pull", "mlp@prod", "--dest", str(dest)]
    done = run_cli(capsys, *cli, "--watch", "--rounds", "2", "--interval", "0", "--json")
    assert done.code == 0, done.err
    lines = [json.loads(line) for line in done.out.strip().splitlines()]
    expected = [(1, True, versions[1]), (2, False, versions[1])]
    assert [(r["round"], r["switched"], r["sha256"]) for r in lines] == expected
    with pytest.raises(NotFoundError):
        watch(app_ctx, "nope@prod", dest, rounds=2, wait=lambda: None)
