"""TensorRT's `IStreamReaderV2` over a `core.chunkstream.VerifiedChunkStream`: a runtime that
deserializes an engine from the stream (`Runtime.deserialize_cuda_engine(reader)`) gets only
verified bytes, a chunk at a time, and never the whole engine in one host buffer.

Written against the documented Python API of TensorRT 10 and TensorRT for RTX 1.x (the class's own
docstring in the `tensorrt_rtx` wheel: subclass `IStreamReaderV2`, call its `__init__`, implement
`read(num_bytes, stream) -> bytes` and `seek(offset, where: SeekPosition) -> bool`; a short read
is followed by more reads until all bytes came). Constructing one needs a CUDA driver (it fails
here with "Failed to open cuda driver"), and TensorRT-RTX refuses the lent H200 (SM 9.0), so no
machine we have runs a deserialization through it: tests/test_chunk_stream.py drives this adapter
with a caller that stands in for TensorRT and calls it as the documentation says TensorRT does.
"""

from __future__ import annotations

import os
from typing import Any

from enginecache.core.chunkstream import SEEK_CUR, SEEK_END, SEEK_SET, VerifiedChunkStream


def stream_reader(trt: Any, stream: VerifiedChunkStream) -> Any:
    """An `IStreamReaderV2` of the TensorRT module `trt` that reads `stream`. A read that fails
    verification raises inside TensorRT's callback; TensorRT then fails the deserialization."""
    whence = {trt.SeekPosition.SET: SEEK_SET, trt.SeekPosition.CUR: SEEK_CUR, trt.SeekPosition.END: SEEK_END}

    class VerifiedStreamReader(trt.IStreamReaderV2):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IStreamReaderV2.__init__(self)
            self.failure: BaseException | None = None

        def read(self, num_bytes: int, _cuda_stream: int) -> bytes:
            try:
                return stream.read(num_bytes)
            except BaseException as err:  # noqa: BLE001 - kept for the caller: TensorRT sees an empty read
                self.failure = err
                return b""

        def seek(self, offset: int, where: Any) -> bool:
            try:
                stream.seek(offset, whence[where])
            except ValueError as err:
                self.failure = err
                return False
            return True

    return VerifiedStreamReader()


def deserialize_verified(trt: Any, runtime: Any, path: str | os.PathLike[str], chunk_blake3: str) -> Any:
    """`runtime.deserialize_cuda_engine` from the blob at `path` through a verified chunk stream;
    the engine, or raises what verification raised (IntegrityCheckError), else what TensorRT's None
    means (RuntimeError). Needs TensorRT on a machine with a CUDA driver."""
    with VerifiedChunkStream(path, chunk_blake3) as stream:
        reader = stream_reader(trt, stream)
        engine = runtime.deserialize_cuda_engine(reader)
    if reader.failure is not None:
        raise reader.failure
    if engine is None:
        raise RuntimeError(f"{os.fspath(path)}: TensorRT could not deserialize the engine from its stream")
    return engine
