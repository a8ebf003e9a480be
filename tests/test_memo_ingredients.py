"""The memo's key derives the precision recipes' environment from the one definition the recipes use
(`core.recipetools`): every tool version `plan_recipe` records, and ModelOpt's availability, change the
memo's key."""

from __future__ import annotations

import pytest

from enginecache.core import recipetools
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.fingerprint import host_fingerprint
from enginecache.core.precision import availability, recipes
from enginecache.core.precision.spec import PrecisionSpec
from enginecache.service.serving import memo
from enginecache.service.serving.runtimetypes import RuntimeSpec
from tests.servingkit import loaded_modules

# (precision, the backend family the recipe is for, whether ModelOpt is importable)
PLANS = [
    ("fp16", "ort", True),
    ("fp16", "ort", False),
    ("bf16", "tensorrt", True),
    ("int8", "ort", False),
    ("int8", "tensorrt", True),
    ("fp8", "tensorrt", True),
]


@pytest.mark.parametrize(("precision", "family", "modelopt"), PLANS)
def test_every_tool_a_recipe_records_is_one_the_memo_keys_by(
    monkeypatch: pytest.MonkeyPatch, precision: str, family: str, modelopt: bool
) -> None:
    asked: list[str] = []

    def version(distribution: str) -> str:
        asked.append(distribution)
        return "1.0"

    monkeypatch.setattr(recipes, "tool_version", version)
    monkeypatch.setattr(recipetools, "importable", lambda _name: modelopt)
    spec = PrecisionSpec(precision, backend_family=family)
    recipe = recipes.plan_recipe(spec, input_shapes={"input": (1, 16)})
    assert asked and set(asked) <= set(recipetools.RECIPE_TOOLS), recipe
    assert recipe["tool_version"] == "1.0"
    if precision in ("fp16", "bf16"):  # the converters tried follow ModelOpt's availability, as the memo's key
        assert ("modelopt" in str(recipe["converters"]).lower()) is modelopt


def test_modelopt_availability_is_the_memos_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    for answer in (True, False):
        monkeypatch.setattr(recipetools, "importable", lambda _name, answer=answer: answer)
        assert availability.modelopt_available() is answer
        assert recipetools.recipe_environment()["modelopt_importable"] is answer


def test_a_tool_upgrade_or_modelopt_appearing_is_another_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    host = host_fingerprint(probe_gpus=False)

    def key() -> str:
        return memo.memo_key(memo.memo_ingredients("d" * 64, RuntimeSpec(backend="ort"), ORT_BACKEND, "1.0", host))

    versions = dict.fromkeys(recipetools.RECIPE_TOOLS, "1.0")
    monkeypatch.setattr(recipetools, "distribution_version", lambda name: versions[name])
    monkeypatch.setattr(recipetools, "importable", lambda _name: False)
    keys = {key()}
    for tool in recipetools.RECIPE_TOOLS:
        versions[tool] = "2.0"
        keys.add(key())
    monkeypatch.setattr(recipetools, "importable", lambda _name: True)
    keys.add(key())
    assert len(keys) == len(recipetools.RECIPE_TOOLS) + 2


def test_the_hit_path_reads_the_recipe_environment_without_core_precision() -> None:
    assert loaded_modules("import enginecache.service.serving.memo", "enginecache.core.precision", "onnx") == []
