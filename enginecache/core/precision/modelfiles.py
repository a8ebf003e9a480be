"""Loading, saving and describing ONNX models for the converters (external data past 2 GB)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from enginecache.errors import PrecisionError

# A serialized ModelProto cannot exceed 2 GiB; leave headroom for the graph itself.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
MAX_MESSAGE = 800


def recipe_record(name: str, tool: str, version: str | None, options: dict[str, object]) -> dict[str, object]:
    return {
        "name": name,
        "tool": tool,
        "tool_version": version,
        "options": options,
        "calibration": None,
        "calibration_digest": None,
        "calibration_samples": None,
    }


def tool_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_model(source: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(source))
    except (OSError, ValueError, DecodeError) as err:
        raise PrecisionError(f"cannot load {source}: {err}") from err


def needs_external_data(source: Path, model: onnx.ModelProto | None) -> bool:
    """Whether the output must keep weights outside the protobuf (source did, or >2 GB)."""
    if source.stat().st_size > EXTERNAL_DATA_THRESHOLD:
        return True
    if model is not None and model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
        return True
    header = onnx.load(str(source), load_external_data=False)
    return any(init.data_location == onnx.TensorProto.EXTERNAL for init in header.graph.initializer)


def save_model(model: onnx.ModelProto, target: Path, *, external: bool) -> None:
    remove_model(target)
    try:
        if external:
            onnx.save(
                model,
                str(target),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=target.name + ".data",
            )
        else:
            onnx.save(model, str(target))
    except (OSError, ValueError) as err:
        raise PrecisionError(f"cannot write {target}: {err}") from err


def remove_model(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".data").unlink(missing_ok=True)


def trim(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
