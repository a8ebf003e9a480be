"""A fuzz of `model add` on mutated protobufs (Hypothesis, bounded in time): whatever bytes come in, the
calling process never crashes and every refusal is the product's own error. Each case runs in the
caller's own process, as the dashboard's upload does: a crash of the protobuf parser or onnx's
checker would take the dashboard down, so it must not happen, and anything other than a clean
registration or an EngineCacheError (a raw DecodeError, ValueError, RecursionError...) fails."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enginecache.errors import EngineCacheError
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.modelfactory import make_conv

SEED_MODEL = make_conv(Path(tempfile.mkdtemp(prefix="fuzz-seed-")) / "conv.onnx").read_bytes()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """The seed model's bytes with some bytes flipped, a slice cut out or repeated, or cut short."""
    data = bytearray(SEED_MODEL)
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "cut", "repeat", "truncate", "insert"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at : at + draw(st.integers(1, 64))]
        elif kind == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 64))]
        elif kind == "truncate":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> AppContext:
    ctx = AppContext.from_settings(tmp_path_factory.mktemp("fuzz") / "home")
    ctx.home.mkdir(parents=True)
    yield ctx  # type: ignore[misc]
    ctx.close()


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated())
def test_model_add_of_mutated_bytes_registers_or_refuses_cleanly(app: AppContext, data: bytes) -> None:
    with tempfile.TemporaryDirectory(dir=app.home.parent) as folder:
        path = Path(folder) / "fuzzed.onnx"
        path.write_bytes(data)
        try:
            result = register_model(app, path, new_version=True)
        except EngineCacheError:
            return  # refused with the product's own words
        assert result.model.digest, "a registered model has its digest"


@pytest.mark.parametrize(
    ("original", "broken", "said"),
    [
        (b"enginecache-tests", b"enginecache-te\xc7ts", "model.producer_name is not valid UTF-8"),  # read back as bytes
        (b"GlobalAveragePool", b"\xc7lobalAveragePool", "is not valid UTF-8"),  # onnx.checker's UnicodeDecodeError
    ],
)
def test_a_string_field_that_is_not_utf8_is_refused_as_invalid(
    app: AppContext, tmp_path: Path, original: bytes, broken: bytes, said: str
) -> None:
    """The two cases the fuzz found: each raised a raw exception (a UnicodeDecodeError from the
    checker; bytes in the catalog's JSON column) before inspection refused them."""
    from enginecache.errors import InvalidModelError

    assert SEED_MODEL.count(original) == 1
    path = tmp_path / "bad-utf8.onnx"
    path.write_bytes(SEED_MODEL.replace(original, broken))
    with pytest.raises(InvalidModelError, match=said):
        register_model(app, path, name="bad-utf8")
