"""Model names follow one documented pattern; user text is shown without escape codes or markup."""

from __future__ import annotations

import pytest

from enginecache.core.names import NAME_MAX, check_model_name, name_from_filename
from enginecache.core.plaintext import markdown_literal, printable
from enginecache.errors import EXIT_BAD_INPUT, ModelNameError, exit_code_for


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
