"""Profiles from dynamic dims, target parsing, and the cache key."""

from __future__ import annotations

import pytest

from enginecache.core.backends.trt.targets import RTX_DEFAULT_TARGETS, normalize_sm, parse_rtx_targets
from enginecache.core.cachekey import INGREDIENTS, compute_cache_key, diff_ingredients
from enginecache.core.onnx_info import TensorInfo
from enginecache.core.profiles import parse_profile_args, parse_shape, resolve_profile
from enginecache.errors import ProfileError, TargetError

IMAGE = TensorInfo("input", "float32", ("batch", 3, 224, 224))
IDS = TensorInfo("input_ids", "int64", ("batch", "seq"))
MASK = TensorInfo("attention_mask", "int64", ("batch", "seq"))


def test_default_profiles_follow_dim_roles_and_say_so() -> None:
    result = resolve_profile([IMAGE])
    (image,) = result.inputs
    assert (image.min, image.opt, image.max) == ((1, 3, 224, 224), (1, 3, 224, 224), (8, 3, 224, 224))
    assert result.defaulted == ("input",)
    assert result.describe_defaults() == [
        "default profile for input: min 1x3x224x224, opt 1x3x224x224, max 8x3x224x224"
    ]


def test_shared_symbolic_dims_agree_across_inputs() -> None:
    result = resolve_profile([IDS, MASK], parse_profile_args(["input_ids=1x16,2x64,4x256"]))
    ids, mask = result.inputs
    assert ids.max == (4, 256)
    assert (mask.min, mask.opt, mask.max) == ((1, 16), (2, 64), (4, 256))
    assert result.defaulted == ("attention_mask",)


def test_fully_dynamic_spatial_and_unknown_dims() -> None:
    tensor = TensorInfo("x", "float32", ("?", 3, "h", "w"))
    (profile,) = resolve_profile([tensor]).inputs
    assert profile.min == (1, 3, 32, 32)
    assert profile.opt == (1, 3, 224, 224)
    assert profile.max == (8, 3, 512, 512)


def test_scalar_input_needs_no_shape() -> None:
    (profile,) = resolve_profile([TensorInfo("step", "int64", ())]).inputs
    assert profile.min == profile.opt == profile.max == ()


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("nope=1x3x224x224", "does not have"),
        ("input=1x3x224", "rank 3"),
        ("input=1x4x224x224", "fixes it to 3"),
        ("input=4x3x224x224,2x3x224x224,8x3x224x224", "min <= opt <= max"),
        ("input=1x3x224x224,2x3x224x224", "one shape or three"),
        ("input=1x3xAx224", "bad shape"),
        ("input=0x3x224x224", "positive"),
        ("1x3x224x224", "INPUT=MIN,OPT,MAX"),
    ],
)
def test_bad_profiles_name_the_problem(arg: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        resolve_profile([IMAGE], parse_profile_args([arg]))


def test_parse_shape() -> None:
    assert parse_shape("1x3x224x224") == (1, 3, 224, 224)


def test_rtx_targets() -> None:
    assert parse_rtx_targets(None) == RTX_DEFAULT_TARGETS
    assert parse_rtx_targets(["sm86,SM80", "8.9"]) == ("sm80", "sm86", "sm89")
    assert normalize_sm("sm_120") == "sm120"
    with pytest.raises(TargetError, match="SM90"):
        parse_rtx_targets(["sm90"])
    with pytest.raises(TargetError, match="unknown target 'gtx'"):
        parse_rtx_targets(["gtx"])


# Each cache-key ingredient: its value in the base key, and another value that must change the key.
INGREDIENT_VALUES: dict[str, tuple[object, object]] = {
    "schema": (1, 2),
    "onnx_digest": ("a" * 64, "b" * 64),
    "precision": (
        {"name": "fp16", "tool": "modelopt.autocast", "tool_version": "0.1"},
        {"name": "fp16", "tool": "onnxconverter_common.float16", "tool_version": "1.16"},
    ),
    "build_options": (
        {"profiles": {"input": {"min": [1], "opt": [1], "max": [8]}}, "opt_level": None},
        {"profiles": {"input": {"min": [1], "opt": [4], "max": [8]}}, "opt_level": None},
    ),
    "backend": ("rtx", "trt"),
    "backend_version": ("1.7.1.116", "1.7.2"),
    "target": ({"compute_capabilities": ["sm86"]}, {"compute_capabilities": ["sm89"]}),
    "os": ("Linux", "Windows"),
}


def _ingredients(**overrides: object) -> dict[str, object]:
    return {name: base for name, (base, _) in INGREDIENT_VALUES.items()} | overrides


def test_cache_key_changes_with_every_ingredient_and_diff_names_it() -> None:
    base = _ingredients()
    key = compute_cache_key(base)
    assert compute_cache_key(dict(reversed(list(base.items())))) == key, "key is order independent"
    assert set(INGREDIENT_VALUES) == set(INGREDIENTS)
    for name, (_, value) in INGREDIENT_VALUES.items():
        other = _ingredients(**{name: value})
        assert compute_cache_key(other) != key, name
        fields = [d.field for d in diff_ingredients(base, other)]
        assert fields and all(f.startswith(name) for f in fields), (name, fields)
    diff = diff_ingredients(base, _ingredients(target={"compute_capabilities": ["sm89"]}))
    assert [(d.field, d.left, d.right) for d in diff] == [("target.compute_capabilities", ["sm86"], ["sm89"])]
    with pytest.raises(ValueError, match="missing: os"):
        compute_cache_key({k: v for k, v in base.items() if k != "os"})
