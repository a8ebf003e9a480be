"""A blob as a stream of verified chunks (core.chunkstream) and its TensorRT `IStreamReaderV2`
adapter (core.backends.trt.streamload).

TensorRT cannot construct a stream reader on this GPU-less machine (its `__init__` needs a CUDA
driver), and TensorRT-RTX refuses the lent H200: the adapter is driven here by callers that stand
in for TensorRT, making the calls its documentation says it makes (reads of any size until all
bytes came, a short read answered by more reads, seeks).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from enginecache.core.backends.trt import streamload
from enginecache.core.chunkstream import SEEK_END, SEEK_SET, VerifiedChunkStream
from enginecache.errors import IntegrityCheckError

CHUNK = 4096


def chunk_list(data: bytes) -> str:
    return f"{CHUNK}:" + "".join(blake3.blake3(data[i : i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK))


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, bytes, str]:
    data = np.random.default_rng(0).bytes(5 * CHUNK + 123)
    path = tmp_path / "engine.bin"
    path.write_bytes(data)
    return path, data, chunk_list(data)


def read_all(stream: VerifiedChunkStream, ask: int) -> bytes:
    out = bytearray()
    while piece := stream.read(ask):
        assert len(piece) <= ask
        out += piece
    return bytes(out)


@pytest.mark.parametrize("ask", [1, 1000, CHUNK, CHUNK + 1, 10 * CHUNK])
def test_reads_of_any_size_return_the_blob_and_never_cross_a_chunk(blob: tuple[Path, bytes, str], ask: int) -> None:
    path, data, chunks = blob
    with VerifiedChunkStream(path, chunks) as stream:
        assert read_all(stream, ask) == data
        assert stream.seek(-123, SEEK_END) == 5 * CHUNK
        assert stream.read(1000) == data[5 * CHUNK :]


def test_a_flipped_byte_stops_the_stream_before_its_chunk_is_handed_out(blob: tuple[Path, bytes, str]) -> None:
    path, data, chunks = blob
    damaged = bytearray(data)
    damaged[2 * CHUNK + 10] ^= 1
    path.write_bytes(damaged)
    with VerifiedChunkStream(path, chunks) as stream:
        assert stream.read(2 * CHUNK) == data[:CHUNK]  # a read ends at its chunk's end
        assert stream.read(CHUNK) == data[CHUNK : 2 * CHUNK]
        with pytest.raises(IntegrityCheckError, match=rf"chunk 2 \(bytes {2 * CHUNK}-{3 * CHUNK - 1}\)"):
            stream.read(1)
        stream.seek(0, SEEK_SET)
        with pytest.raises(IntegrityCheckError, match="failed earlier"):
            stream.read(1)


def test_a_row_without_chunk_digests_cannot_be_streamed(blob: tuple[Path, bytes, str]) -> None:
    with pytest.raises(ValueError, match="no chunk digests"):
        VerifiedChunkStream(blob[0], None)
    with pytest.raises(IntegrityCheckError, match="cannot cover"):
        VerifiedChunkStream(blob[0], f"{CHUNK}:" + "0" * 64)


def test_a_seek_outside_the_blob_is_refused(blob: tuple[Path, bytes, str]) -> None:
    with VerifiedChunkStream(blob[0], blob[2]) as stream, pytest.raises(ValueError, match="outside the blob"):
        stream.seek(1, SEEK_END)


class TensorRTStandIn:
    """Stands in for the `tensorrt` module: an `IStreamReaderV2` base whose `__init__` works without
    a CUDA driver, the `SeekPosition` values, and a `Runtime` whose `deserialize_cuda_engine` reads
    the stream as TensorRT documents (requests of `request` bytes, repeated after a short read)."""

    class IStreamReaderV2:
        def __init__(self) -> None:
            self.initialised = True

    SeekPosition = types.SimpleNamespace(SET="SET", CUR="CUR", END="END")

    def __init__(self, request: int) -> None:
        self.request = request
        self.received = bytearray()

    def deserialize_cuda_engine(self, reader: Any) -> Any:
        assert reader.initialised, "the adapter must call IStreamReaderV2.__init__"
        assert reader.seek(0, self.SeekPosition.SET)
        while piece := reader.read(self.request, 0):
            self.received += piece
        return {"engine": bytes(self.received)} if self.received else None


@pytest.mark.parametrize("request_bytes", [7, CHUNK, 64 * CHUNK])
def test_the_adapter_feeds_a_stand_in_for_tensorrt_every_verified_byte(
    blob: tuple[Path, bytes, str], request_bytes: int
) -> None:
    path, data, chunks = blob
    trt = TensorRTStandIn(request_bytes)
    engine = streamload.deserialize_verified(trt, trt, path, chunks)
    assert engine == {"engine": data}


def test_the_adapter_reports_a_damaged_chunk_to_a_stand_in_for_tensorrt(blob: tuple[Path, bytes, str]) -> None:
    path, data, chunks = blob
    damaged = bytearray(data)
    damaged[-1] ^= 1
    path.write_bytes(damaged)
    trt = TensorRTStandIn(CHUNK)
    with pytest.raises(IntegrityCheckError, match="chunk 5"):
        streamload.deserialize_verified(trt, trt, path, chunks)
    assert bytes(trt.received) == data[: 5 * CHUNK]  # what it got before the bad chunk was verified
