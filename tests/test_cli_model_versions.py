"""A model name's versions in the CLI (issue 28, point 3): `model list` has a header and a version and
aliases column; `engine list --model NAME` lists every version's engines and says which versions it
shows (`NAME@vN` one of them); `NAME@vN` and `NAME@ALIAS` name a model in every command that names
one, through the one resolver (`service.readmodels.modelrefs`); a version the name lacks is exit 2
naming the versions it has.

The scene is the issue's: version 1 of `m` has six READY engines, version 2 none."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import SQLModel

from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.clirunner import CliResult, run_cli
from tests.modelfactory import make_mlp

READY_ON_V1 = 6


def _cli(capsys: pytest.CaptureFixture[str], app: AppContext, *args: str) -> CliResult:
    return run_cli(capsys, "--home", str(app.home), "--db", app.db_url, *args)


def _ok(result: CliResult) -> Any:
    assert result.code == 0, result.err
    return result.json()


def _engines(app: AppContext, model_id: int, count: int) -> list[int]:
    """`count` READY ORT engine rows of `model_id` (no blob: the listings never read one)."""
    rows: list[dict[str, Any]] = [
        {
            "model_id": model_id,
            "backend": "ort",
            "backend_version": "1.0",
            "precision": ("fp32", "fp16")[i % 2],
            "targets": "x86_64-avx2",
            "cache_key": f"{model_id:032x}{i:032x}",
            "status": "READY",
            "onnx_digest": f"{model_id:064x}",
            "key_ingredients": {},
            "precision_recipe": {},
            "build_options": {},
            "target_info": {},
            "os": "Linux",
            "host": {},
            "io": [],
            "warnings": [],
            "builder_log": "",
            "created_at": datetime.now(UTC),
        }
        for i in range(count)
    ]
    with app.catalog.engine.begin() as connection:
        connection.execute(sa.insert(SQLModel.metadata.tables["engines"]), rows)
        found = connection.execute(sa.text("SELECT id FROM engines WHERE model_id = :m"), {"m": model_id})
        return sorted(int(row[0]) for row in found)


@pytest.fixture
def scene(app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`m` v1 (six READY engines, `prod` points at it) and v2 (none), a converted variant of v1, and `other`."""
    v1 = _ok(
        _cli(capsys, app_ctx, "model", "add", str(make_mlp(tmp_path / "1" / "m.onnx", seed=1)), "--name", "m", "--json")
    )
    v2_path = str(make_mlp(tmp_path / "2" / "m.onnx", seed=2))
    v2 = _ok(_cli(capsys, app_ctx, "model", "add", v2_path, "--name", "m", "--new-version", "--json"))
    variant = register_model(
        app_ctx, make_mlp(tmp_path / "3" / "m.fp16.onnx", seed=3), name="m.fp16", parent_id=v1["id"]
    ).model
    other = _ok(_cli(capsys, app_ctx, "model", "add", str(make_mlp(tmp_path / "4" / "o.onnx", seed=4)), "--json"))
    assert _cli(capsys, app_ctx, "release", "promote", "m", "--alias", "prod", "--version", "1").code == 0
    return {
        "v1": v1["id"],
        "v2": v2["id"],
        "variant": variant.id,
        "other": other["id"],
        "v1_engines": _engines(app_ctx, v1["id"], READY_ON_V1),
        "added": (v1, v2),
    }


def test_model_add_says_which_version_the_bytes_became(scene: dict[str, Any]) -> None:
    v1, v2 = scene["added"]
    assert (v1["version"], v2["version"]) == (1, 2)
    assert v1["aliases"] == [] and v2["aliases"] == [], "promoted after adding"


def test_model_list_has_a_header_and_a_version_and_aliases_column(
    app_ctx: AppContext, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    listed = {m["id"]: m for m in _ok(_cli(capsys, app_ctx, "model", "list", "--json"))}
    assert listed[scene["v1"]]["version"] == 1 and listed[scene["v2"]]["version"] == 2
    assert listed[scene["v1"]]["aliases"] == [{"alias": "prod", "gpu_class": None}]
    assert listed[scene["v2"]]["aliases"] == []
    assert listed[scene["variant"]]["version"] is None, "a converted variant is no version of its own"
    assert listed[scene["other"]]["version"] == 1

    header, *rows = _cli(capsys, app_ctx, "model", "list").out.splitlines()
    assert header.split() == ["ID", "NAME", "VERSION", "ALIASES", "SIZE", "SHA256"]
    by_id = {int(row.split()[0]): row.split() for row in rows}
    assert by_id[scene["v1"]][1:4] == ["m", "v1", "prod"]
    assert by_id[scene["v2"]][1:4] == ["m", "v2", "-"]
    assert by_id[scene["variant"]][1:3] == ["m.fp16", "-"]
    assert rows[0][header.index("VERSION") :].startswith("v1"), "the columns line up under the header"


def test_engine_list_of_a_name_covers_every_version_and_says_so(
    app_ctx: AppContext, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue: `engine list --model m` said "no engines" once v2 existed, though v1 has six READY."""
    listed = _ok(_cli(capsys, app_ctx, "engine", "list", "--model", "m", "--json"))
    assert sorted(e["id"] for e in listed) == scene["v1_engines"]
    assert {(e["model"], e["model_version"]) for e in listed} == {("m", 1)}

    text = _cli(capsys, app_ctx, "engine", "list", "--model", "m").out.splitlines()
    assert text[0] == "engines of m, every version (v1 and v2); m@v2 names one"
    assert text[1].split()[:3] == ["ID", "MODEL", "VER"]
    assert len(text) == 2 + READY_ON_V1 and all(line.split()[1:3] == ["m", "v1"] for line in text[2:])


def test_name_at_version_and_name_at_alias_narrow_the_list_to_one_version(
    app_ctx: AppContext, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    at_v1 = _ok(_cli(capsys, app_ctx, "engine", "list", "--model", "m@v1", "--json"))
    assert sorted(e["id"] for e in at_v1) == scene["v1_engines"]
    assert _ok(_cli(capsys, app_ctx, "engine", "list", "--model", "m@v2", "--json")) == []
    assert (
        _cli(capsys, app_ctx, "engine", "list", "--model", "m@v2").out == "engines of m v2 (of v1 and v2)\nno engines\n"
    )
    prod = _cli(capsys, app_ctx, "engine", "list", "--model", "m@prod")
    assert prod.out.splitlines()[0] == "engines of m@prod: v1 (of v1 and v2)"
    assert len(prod.out.splitlines()) == 2 + READY_ON_V1
    by_id = _ok(_cli(capsys, app_ctx, "engine", "list", "--model", str(scene["v2"]), "--json"))
    assert by_id == [], "an id names one model, not its name's every version"


def test_every_command_that_names_a_model_reads_name_at_version(
    app_ctx: AppContext, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    shown = _ok(_cli(capsys, app_ctx, "model", "show", "m@v1", "--json"))
    assert (shown["id"], shown["version"]) == (scene["v1"], 1)
    assert _ok(_cli(capsys, app_ctx, "model", "show", "m", "--json"))["id"] == scene["v2"], "NAME: the newest"
    assert _ok(_cli(capsys, app_ctx, "model", "show", "m@prod", "--json"))["id"] == scene["v1"]
    assert "version v1, aliases prod" in _cli(capsys, app_ctx, "model", "show", "m@v1").out

    queued = _ok(_cli(capsys, app_ctx, "build", "m@v1", "--backend", "ort", "--queue", "--json"))
    job = _ok(_cli(capsys, app_ctx, "job", "show", str(queued["job_id"]), "--json"))
    assert job["payload"]["model"] == str(scene["v1"]), "the build is of version 1, not the newest"

    profiles = _cli(capsys, app_ctx, "profiles", "m@v1", "--json").json()  # exit 1 where none fits this CPU
    assert profiles["model_id"] == scene["v1"] and len(profiles["profiles"]) == READY_ON_V1
    assert _cli(capsys, app_ctx, "profiles", "m@v2", "--json").json()["model_id"] == scene["v2"]
    verified = _ok(_cli(capsys, app_ctx, "verify", "--model", "m@v2", "--json"))
    assert [(r["kind"], r["id"], r["ok"]) for r in verified] == [("model", scene["v2"], True)]


@pytest.mark.parametrize(
    "args",
    [
        ["engine", "list", "--model", "m@v3"],
        ["model", "show", "m@v3"],
        ["build", "m@v3", "--backend", "ort", "--queue"],
        ["profiles", "m@v3"],
        ["pull", "m@v3", "--dest", "DEST"],
        ["ready", "--model", "m@v3", "--backend", "ort"],
        ["export", "DEST", "--model", "m@v3"],
        ["verify", "--model", "m@v3"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_version_the_name_lacks_is_bad_input_naming_the_versions_it_has(
    app_ctx: AppContext, scene: dict[str, Any], capsys: pytest.CaptureFixture[str], args: list[str], tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    refused = _cli(capsys, app_ctx, *(str(dest) if word == "DEST" else word for word in args), "--json")
    assert refused.code == 2, (refused.out, refused.err)
    document = json.loads(refused.out)  # the one document is the error object
    assert document["kind"] == "bad_input"
    assert document["error"] == "model 'm' has no version v3: its versions are v1 and v2"
    assert refused.err.startswith("error: model 'm' has no version v3")
    assert not dest.exists(), "nothing written"


def test_an_unset_alias_and_an_alias_that_looks_like_a_version(
    app_ctx: AppContext, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    unset = _cli(capsys, app_ctx, "engine", "list", "--model", "m@canary", "--json")
    assert unset.code == 2 and unset.json()["kind"] == "not_found"
    assert "alias m@canary is not set" in unset.err and "m's versions: v1 and v2; its aliases: prod" in unset.err
    refused = _cli(capsys, app_ctx, "release", "promote", "m", "--alias", "v2", "--version", "1")
    assert refused.code == 2 and "not v<number>" in refused.err, "m@v2 always means version 2"
    assert _cli(capsys, app_ctx, "engine", "list", "--model", "nope@v1").code == 2
