"""core.lazyimport: a backend library is imported by its dotted name or refused with its install hint,
and `importable` answers what `importlib.util.find_spec` answers (the cache hit asks it without
importing importlib.util; ModelOpt's availability and the memo both ask it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from enginecache.core import recipetools
from enginecache.core.lazyimport import import_backend, importable
from enginecache.core.precision import availability
from enginecache.errors import BackendUnavailableError
from enginecache.service.serving import memo


def test_import_backend_returns_the_named_module_itself() -> None:
    assert import_backend("json.decoder") is sys.modules["json.decoder"]
    assert import_backend("onnxruntime").__name__ == "onnxruntime"


def test_a_missing_backend_library_is_refused_with_its_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if not installed: its import raises ImportError
    with pytest.raises(BackendUnavailableError, match="NVML bindings are not installed: pip install"):
        import_backend("pynvml")


@pytest.mark.parametrize(
    "name", ["json", "onnxruntime", "tensorrt_rtx", "enginecache", "no_such_module_here", "_sqlite3"]
)
def test_importable_answers_as_find_spec(name: str) -> None:
    assert importable(name) is (importlib.util.find_spec(name) is not None)


def test_importable_finds_a_module_nothing_imported_yet_and_imports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fresh_module_for_importable.py").write_text("raise RuntimeError('imported')\n")
    assert not importable("fresh_module_for_importable")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importable("fresh_module_for_importable")
    assert "fresh_module_for_importable" not in sys.modules


def test_a_blocked_module_is_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # how an import is blocked on purpose
    assert not importable("onnxruntime")


def test_importable_takes_top_level_names_only() -> None:
    with pytest.raises(ValueError, match="top-level module name"):
        importable("json.decoder")


def test_the_memo_asks_for_what_modelopt_availability_asks_for() -> None:
    """Both ask `core.recipetools` (tests/test_memo_ingredients.py checks what each answers)."""
    assert availability.MODELOPT_MODULES is recipetools.MODELOPT_MODULES
    assert memo.recipe_environment is recipetools.recipe_environment
