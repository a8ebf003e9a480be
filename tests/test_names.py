"""Model names follow one documented pattern; user text is shown without escape codes or markup."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.core.names import NAME_MAX, check_model_name, name_from_filename
from enginecache.core.plaintext import markdown_literal, printable
from enginecache.errors import EXIT_BAD_INPUT, ModelNameError, exit_code_for
from enginecache.service.context import AppContext
from enginecache.service.models.register import get_model, list_models, register_model
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp


@pytest.mark.parametrize("name", ["resnet18", "a.b-c_d", "model.fp16", "_x", "9lives", "a" * NAME_MAX])
def test_names_in_the_pattern_are_kept(name: str) -> None:
    assert check_model_name(name) == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", ".hidden", "x/y", "../victim", "a\nb", "a\x1b[2Jb", "<img src=x>", "a b", "a" * 129]
)
def test_names_outside_the_pattern_are_refused_as_bad_input(name: str) -> None:
    with pytest.raises(ModelNameError, match="is not allowed: use 1-128 characters") as raised:
        check_model_name(name)
    assert "\n" not in str(raised.value) and "\x1b" not in str(raised.value), "shown with repr"
    assert exit_code_for(raised.value) == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    ("stem", "name"), [("my model (1)", "my_model_1"), ("..evil", "evil"), ("...", "model"), ("x" * 300, "x" * 128)]
)
def test_a_default_name_from_a_file_name_is_made_valid(stem: str, name: str) -> None:
    assert name_from_filename(stem) == name


def test_printable_escapes_what_would_forge_a_terminal_line() -> None:
    assert printable("ok\nFAKE LINE\x1b[31m\u202e\t") == "ok\\nFAKE LINE\\x1b[31m\\u202e\\t"
    assert printable("plain name-1.onnx") == "plain name-1.onnx"


def test_markdown_literal_leaves_no_markup() -> None:
    text = markdown_literal("![x](http://evil/i.png) **b** <img src=x>")
    assert "![" not in text and "](" not in text and "**" not in text
    assert all(text[i - 1] == "\\" for i, c in enumerate(text) if c in "<>![]()*"), "every meta-character escaped"
    assert text.replace("\\", "") == "![x](http://evil/i.png) **b** <img src=x>", "the same characters, escaped"


# -- through registration -------------------------------------------------------------------


def test_a_bad_name_is_refused_before_anything_is_stored(app_ctx: AppContext, tmp_path: Path) -> None:
    model = make_mlp(tmp_path / "mlp.onnx")
    for bad in ("..", ".", "../victim", "a\nb"):
        with pytest.raises(ModelNameError):
            register_model(app_ctx, model, name=bad)
    assert list_models(app_ctx) == []
    assert not list((app_ctx.home / "models").glob("*")) if (app_ctx.home / "models").exists() else True


def test_a_taken_name_is_refused_unless_the_bytes_are_its_new_version(app_ctx: AppContext, tmp_path: Path) -> None:
    first = register_model(app_ctx, make_mlp(tmp_path / "a.onnx", seed=1), name="victim").model
    other = make_mlp(tmp_path / "b.onnx", seed=2)
    with pytest.raises(ModelNameError, match=rf"'victim' is taken by model {first.id}.*--new-version"):
        register_model(app_ctx, other, name="victim")
    assert get_model(app_ctx, "victim").id == first.id, "nothing was taken over"
    again = register_model(app_ctx, make_mlp(tmp_path / "a.onnx", seed=1), name="victim")
    assert again.created is False and again.model.id == first.id, "the same bytes: the same model"
    second = register_model(app_ctx, other, name="victim", new_version=True).model
    assert second.id != first.id and get_model(app_ctx, "victim").id == second.id, "the newest answers the name"


def test_a_default_name_comes_from_the_file_name_made_valid(app_ctx: AppContext, tmp_path: Path) -> None:
    model = register_model(app_ctx, make_mlp(tmp_path / "my model (1).onnx")).model
    assert model.name == "my_model_1"


def test_cli_model_add_refuses_a_bad_or_taken_name_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = ["--home", str(tmp_path / "home")]
    first = run_cli(capsys, *home, "model", "add", str(make_mlp(tmp_path / "a.onnx", seed=1)), "--name", "m")
    assert first.code == 0, first.err
    bad = run_cli(capsys, *home, "model", "add", str(make_mlp(tmp_path / "b.onnx", seed=2)), "--name", "../m")
    assert bad.code == EXIT_BAD_INPUT and "is not allowed" in bad.err
    taken = run_cli(capsys, *home, "model", "add", str(tmp_path / "b.onnx"), "--name", "m")
    assert taken.code == EXIT_BAD_INPUT and "is taken by model" in taken.err
    versioned = run_cli(capsys, *home, "model", "add", str(tmp_path / "b.onnx"), "--name", "m", "--new-version")
    assert versioned.code == 0, versioned.err


def test_the_dashboards_errors_show_a_hostile_message_as_literal_text() -> None:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(
        "from enginecache.dashboard import data\n"
        "from enginecache.errors import InvalidModelError\n"
        "data.show_error(InvalidModelError('model ![x](http://evil/i.png) **bold**'), 'register')\n"
    ).run()
    (shown,) = at.error
    assert "![" not in shown.value and "**" not in shown.value, "no image to fetch, no markup"
    assert shown.value.replace("\\", "") == "register: model ![x](http://evil/i.png) **bold**"


HOSTILE_OUTPUT = "y\x1b]0;PWN\x07"


def test_test_load_prints_a_hostile_output_name_escaped(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output named with a terminal title escape: `test-load` wrote it raw (other commands
    escaped it); every line the CLI writes now goes through one filter (`terminal_text`)."""
    import onnx

    from enginecache.service.builds.plan import BuildRequest, build_engine

    model = onnx.load(str(make_mlp(tmp_path / "mlp.onnx")))
    model.graph.node[-1].output[0] = HOSTILE_OUTPUT
    model.graph.output[0].name = HOSTILE_OUTPUT
    onnx.save(model, str(tmp_path / "hostile.onnx"))
    register_model(app_ctx, tmp_path / "hostile.onnx", name="hostile")
    engine = build_engine(app_ctx, BuildRequest(model="hostile", backend="ort")).engine
    home = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    shown = run_cli(capsys, *home, "test-load", str(engine.id), "--here", "--iterations", "2")
    assert shown.code == 0, shown.err
    assert "\x1b" not in shown.out + shown.err and "\x07" not in shown.out + shown.err
    assert printable(HOSTILE_OUTPUT) in shown.out
