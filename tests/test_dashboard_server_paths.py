"""The Models view under AppTest: "Path on the server" only under ENGINECACHE_IMPORT_ROOTS (off
without it), one message for missing and not allowed, no file's bytes in any error; and every
user-supplied string (producer, file name, name) shown as plain text, never as Markdown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from enginecache.core.plaintext import markdown_literal
from enginecache.dashboard.views.models import IMPORT_ROOTS_ENV, NOT_IMPORTABLE
from enginecache.db.models import ModelRecord
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.dashboardkit import serve_home, texts, view
from tests.modelfactory import make_mlp, save_unchecked
from tests.test_dashboard_views import plain

SECRET = b"root:*:20000:0:99999:7:::\nalice:$6$not-a-real-hash:20000::::::\n"
EVIL = "![x](http://evil/i.png)"


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    home = tmp_path / "home"
    serve_home(home, monkeypatch)
    monkeypatch.delenv(IMPORT_ROOTS_ENV, raising=False)
    ctx = AppContext.from_settings(home)
    yield ctx
    ctx.close()


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The one import root, with a model in it; beside it (outside), a secret and a model."""
    folder = tmp_path / "models"
    make_mlp(folder / "mlp.onnx")
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "shadow.onnx").write_bytes(SECRET)
    make_mlp(outside / "other.onnx", seed=3)
    monkeypatch.setenv(IMPORT_ROOTS_ENV, f"{tmp_path / 'elsewhere'}:{folder}:relative/ignored")
    return folder


def _register_path(path: str) -> AppTest:
    at = view("models").run()
    at.text_input(key="models_path").set_value(path).run()
    at.button(key="models_path_submit").click().run()
    assert not at.exception
    return at


def _one_error(at: AppTest) -> str:
    assert len(at.error) == 1, [e.value for e in at.error]
    return plain(at.error[0].value)


def _stored(app: AppContext) -> list[str]:
    with app.catalog.read() as session:
        return [m.name for m in session.exec(select(ModelRecord)).all()]


def test_without_import_roots_the_path_form_is_not_shown(catalog: AppContext) -> None:
    at = view("models").run()
    assert not at.exception
    assert [t.key for t in at.text_input] == ["models_upload_name"]
    assert "models_path_submit" not in [b.key for b in at.button]
    assert any(IMPORT_ROOTS_ENV in c.value for c in at.caption), [c.value for c in at.caption]


def test_a_model_under_an_import_root_registers(catalog: AppContext, root: Path) -> None:
    at = _register_path(str(root / "mlp.onnx"))
    assert not at.error, [e.value for e in at.error]
    assert any("Registered: mlp" in plain(s.value) for s in at.success)
    assert _stored(catalog) == ["mlp"]


def test_missing_and_not_allowed_get_one_message_that_quotes_no_bytes(
    catalog: AppContext, root: Path, tmp_path: Path
) -> None:
    (root / "link.onnx").symlink_to(tmp_path / "private" / "other.onnx")  # a symlink out of the root
    (root / "sub").mkdir()
    cases = {
        "secret outside": str(tmp_path / "private" / "shadow.onnx"),
        "model outside": str(tmp_path / "private" / "other.onnx"),
        "missing outside": str(tmp_path / "private" / "nothing.onnx"),
        "missing inside": str(root / "nothing.onnx"),
        "symlink out": str(root / "link.onnx"),
        "climbing out": str(root / ".." / "private" / "other.onnx"),
        "a folder": str(root / "sub"),
        "relative": "models/mlp.onnx",
        "system file": "/etc/shadow",
    }
    messages = {}
    for case, path in cases.items():
        message = _one_error(_register_path(path))
        assert NOT_IMPORTABLE in message, (case, message)
        assert "root:" not in message and "alice" not in message, (case, message)
        messages[case] = message.replace(repr(path), "PATH")
    assert len(set(messages.values())) == 1, messages
    assert _stored(catalog) == []


def test_a_bad_file_under_a_root_is_refused_without_echoing_it(catalog: AppContext, root: Path) -> None:
    (root / "passwords.onnx").write_bytes(SECRET)
    message = _one_error(_register_path(str(root / "passwords.onnx")))
    assert "is not an ONNX model" in message
    assert "root:" not in message and "alice" not in message and "20000" not in message, message
    assert _stored(catalog) == []


def test_user_strings_on_the_models_view_are_plain_text(catalog: AppContext, tmp_path: Path) -> None:
    """A producer, a file name and an op name that are Markdown, HTML or an image link show as
    those characters: no element gets them unescaped, so nothing is rendered or fetched."""
    source = make_mlp(tmp_path / "src" / "mlp.onnx")
    model = onnx.load(str(source))
    model.producer_name = EVIL
    model.producer_version = "**bold** <img src=http://evil/j.png>"
    odd = tmp_path / "odd" / "![y](evil.png)_*x*.onnx"
    odd.parent.mkdir()
    save_unchecked(model, odd)
    register_model(catalog, odd, name="odd")

    at = view("models").run()
    assert not at.exception
    raw = "\n".join([texts(at)] + [str(m.value) for m in at.metric])  # the Markdown each element is given
    for user_string in (EVIL, "**bold** <img src=http://evil/j.png>", odd.name):
        assert user_string not in raw, user_string
        assert markdown_literal(user_string) in raw, user_string  # every meta-character escaped
    assert EVIL in plain(raw) and odd.name in plain(raw)  # shown as those characters
