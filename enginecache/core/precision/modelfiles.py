"""Loading, saving, staging and describing ONNX models for the converters (external data past 2 GB),
and the converters' failures in our words."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from enginecache.core.onnx_graph import external_refs, normalise_location
from enginecache.core.onnx_initinputs import describe, drop_initializer_inputs, initializer_inputs
from enginecache.core.onnx_quantized import quantization
from enginecache.errors import PrecisionError

logger = logging.getLogger(__name__)

# A serialized ModelProto cannot exceed 2 GiB; leave headroom for the graph itself.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
MAX_MESSAGE = 800

# What a quantizer (`ptq.quantize_modelopt`, `quantize.quantize_ort`) returns: the recipe it records,
# notes for the user, and the hint shown where its quantized graph then fails validation.
Quantized = tuple[dict[str, object], list[str], str]


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


def source_quantization(source: Path) -> str | None:
    """How `source` is already quantized (see `onnx_quantized.quantization`), read without its weights."""
    try:
        model = onnx.load(str(source), load_external_data=False)
    except (OSError, ValueError, DecodeError) as err:
        raise PrecisionError(f"cannot load {source}: {err}") from err
    return quantization(model)


def stage_source(source: Path, folder: Path) -> Path:
    """Copy `source` and its external data files into `folder`; the staged model's path.

    Converters write beside their input and even over it: ModelOpt's PTQ runs
    `onnx.shape_inference.infer_shapes_path(onnx_path)`, which rewrites the model in place, and
    onnxruntime.quantization writes `<model>-inferred.onnx` beside it. The source lives in the
    content-addressed artifact store, where a rewrite would break its digest, so converters get a
    copy in the job's work folder. A copy, never a hard or symbolic link: either would let that
    in-place rewrite reach the stored file.
    """
    folder.mkdir(parents=True, exist_ok=True)
    header = onnx.load(str(source), load_external_data=False)
    names = {source.name: source}
    for _, location, _ in external_refs(header):
        relative = normalise_location(location)
        names[relative] = source.parent / relative
    try:
        for relative, original in names.items():
            staged = folder / relative
            staged.parent.mkdir(parents=True, exist_ok=True)
            staged.unlink(missing_ok=True)
            shutil.copyfile(original, staged)
    except OSError as err:
        raise PrecisionError(f"cannot copy {source.name} into the work folder {folder}: {err}") from err
    return folder / source.name


@contextlib.contextmanager
def staged_copy(source: Path, folder: Path) -> Iterator[Path]:
    """`stage_source` into `folder`, which is removed on the way out with all a converter wrote there."""
    staged = stage_source(source, folder)
    try:
        yield staged
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)


@contextlib.contextmanager
def converter_source(source: Path, folder: Path) -> Iterator[tuple[Path, list[str]]]:
    """`source` as a converter takes it, and notes: where it lists initializers among its graph
    inputs (`core.onnx_initinputs`), a staged copy in `folder` (removed on the way out) with them
    taken out of the inputs, and a note saying so; else `source` itself and no note."""
    header = onnx.load(str(source), load_external_data=False)
    names = initializer_inputs(header.graph)
    if not names:
        yield source, []
        return
    with staged_copy(source, folder) as staged:
        model = onnx.load(str(staged), load_external_data=False)  # external data stays where it is
        drop_initializer_inputs(model)
        try:
            onnx.save(model, str(staged))
        except (OSError, ValueError) as err:
            raise PrecisionError(f"cannot write {staged}: {err}") from err
        note = (
            f"{source.name}: {describe(names, int(header.ir_version))}; taken out of the inputs before "
            "conversion (their values stay the weights), as the converters need"
        )
        yield staged, [note]


@contextlib.contextmanager
def converter_failure(failed: str, target: Path | None = None) -> Iterator[None]:
    """Any exception of the converter run inside as a PrecisionError: `failed` (what failed, in
    words), the exception's type and its trimmed message; `target`, the model being written, is
    removed first. Converters raise asserts, onnx, ORT and graphsurgeon errors alike."""
    try:
        yield
    except Exception as err:
        if target is not None:
            remove_model(target)
        raise PrecisionError(f"{failed}: {type(err).__name__}: {trim(str(err))}") from err


@contextlib.contextmanager
def captured_output(tool: str) -> Iterator[io.StringIO]:
    """Keep a converter's prints and progress bars (stdout and stderr) out of our output, which may
    be JSON; they go to the debug log instead."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        text = buffer.getvalue().strip()
        if text:
            logger.debug("%s said:\n%s", tool, text[-20_000:])
