"""One new process of bench_llm: a build of the Llama-like model, ours or its floor.

    llm_child.py product HOME_TEMPLATE MODEL BACKEND PRECISION [enginecache build options...]
        a fresh home made from HOME_TEMPLATE (its catalog copied, its store hard-linked, so the
        registered model is there and no engine is), then `enginecache build` in this process
        (the CLI's own entry point, as `enginecache build ...` runs it); the home is removed after.
    llm_child.py raw-rtx ONNX TARGET PROFILE...
        TensorRT-RTX by hand, as a user's build script does it: parse the file (strongly typed),
        the target's compute capability, one optimization profile, build, write the plan.
    llm_child.py raw-ort ONNX
        ONNX Runtime by hand: a CPU session that saves its optimized model in ORT format.

PROFILE arguments are NAME=MIN,OPT,MAX with shapes like 1x128 (the CLI's --profile form). Each
prints `BENCH_JSON {"engine_bytes": N}` after writing the engine.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path


def _product(template: Path, model: str, backend: str, precision: str, options: list[str]) -> None:
    home = Path(tempfile.mkdtemp(prefix="llm-home-", dir=template.parent))
    try:
        for entry in template.iterdir():
            if entry.name.startswith("catalog.db"):
                shutil.copy2(entry, home / entry.name)
            elif entry.is_dir():
                subprocess.run(["cp", "-al", str(entry), str(home / entry.name)], check=True)
        os.environ["ENGINECACHE_HOME"] = str(home)
        from enginecache.cli.entry import main

        argv = ["enginecache", "build", model, "--backend", backend, "--precision", precision, "--json", *options]
        sys.argv = argv
        try:
            main()
        except SystemExit as done:
            if done.code not in (0, None):
                raise
        with sqlite3.connect(home / "catalog.db") as catalog:
            (size,) = catalog.execute(
                "SELECT size_bytes FROM engines WHERE status = 'READY' ORDER BY id DESC"
            ).fetchone()
        print("BENCH_JSON " + json.dumps({"engine_bytes": size}), flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split("x"))


def _raw_rtx(onnx_path: Path, target: str, profiles: list[str]) -> None:
    import tensorrt_rtx as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise SystemExit("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(getattr(trt.ComputeCapability, target.upper()), 0)
    profile = builder.create_optimization_profile()
    for text in profiles:
        name, _, shapes = text.partition("=")
        low, opt, high = (_shape(s) for s in shapes.split(","))
        profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SystemExit("TensorRT-RTX built no engine")
    with tempfile.NamedTemporaryFile(dir=onnx_path.parent, suffix=".engine") as out:
        out.write(memoryview(plan))
        out.flush()
        print("BENCH_JSON " + json.dumps({"engine_bytes": os.path.getsize(out.name)}), flush=True)


def _raw_ort(onnx_path: Path) -> None:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(dir=onnx_path.parent) as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(tmp) / "model.ort")
        options.add_session_config_entry("session.save_model_format", "ORT")
        ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        print(
            "BENCH_JSON " + json.dumps({"engine_bytes": os.path.getsize(options.optimized_model_filepath)}), flush=True
        )


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "product":
        template, model, backend, precision, *options = args
        _product(Path(template), model, backend, precision, options)
    elif mode == "raw-rtx":
        onnx_path, target, *profiles = args
        _raw_rtx(Path(onnx_path), target, profiles)
    elif mode == "raw-ort":
        _raw_ort(Path(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
