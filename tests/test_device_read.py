"""The device read's checks that hold without a GPU (core.deviceread, core.gpublake3).

CUDA cannot run on this machine or in CI: what moves bytes to a device and hashes them there is
run on the lent H200 by bench/gpu/device_read.py, which checks the GPU BLAKE3 kernels against the
`blake3` package around every boundary of the tree, checks that both device paths leave exactly
the file's bytes on the device and name a flipped byte's chunk, and then times them
(bench/results/device_read_h200.json). Here: the arguments a caller can get wrong, and the clear
error on a host without the `gpu` extra.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import blake3
import pytest

from enginecache.core.deviceread import device_pointer, read_verified_to_device
from enginecache.core.gpublake3 import check_piece_size
from enginecache.errors import BackendUnavailableError


class DeviceArrayInterface:
    """An object that describes device memory as CuPy and PyTorch do (`__cuda_array_interface__`);
    nothing is ever read from or written to its address here."""

    def __init__(self, shape: tuple[int, ...], typestr: str = "|u1", strides: Any = None) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0x7F0000000000, False),
            "version": 3,
            "strides": strides,
        }


def test_device_pointer_reads_address_and_size_from_the_interface() -> None:
    assert device_pointer(DeviceArrayInterface((10, 4), "<f4")) == (0x7F0000000000, 160)
    assert device_pointer(DeviceArrayInterface((7,))) == (0x7F0000000000, 7)


def test_host_memory_and_strided_buffers_are_refused() -> None:
    with pytest.raises(ValueError, match="not device memory"):
        device_pointer(bytearray(10))
    with pytest.raises(ValueError, match="contiguous"):
        device_pointer(DeviceArrayInterface((4, 4), strides=(8, 1)))


def test_a_buffer_smaller_than_the_file_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    path = tmp_path / "engine.bin"
    path.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="100 bytes do not fit a device buffer of 99"):
        read_verified_to_device(path, DeviceArrayInterface((99,)), blake3_digest=blake3.blake3(b"x" * 100).hexdigest())


@pytest.mark.skipif(
    importlib.util.find_spec("cupy") is not None or importlib.util.find_spec("kvikio") is not None,
    reason="the gpu extra is installed here: the missing-library error cannot be seen",
)
def test_without_the_gpu_extra_the_error_names_it(tmp_path: Path) -> None:
    path = tmp_path / "engine.bin"
    path.write_bytes(b"x" * 100)
    with pytest.raises(BackendUnavailableError, match=r"enginecache\[gpu\]"):
        read_verified_to_device(path, DeviceArrayInterface((100,)), blake3_digest=blake3.blake3(b"x" * 100).hexdigest())


@pytest.mark.parametrize("chunk_bytes", [256 * 1024, 32 * 1024 * 1024])
def test_the_kernels_take_pieces_of_whole_thread_blocks(chunk_bytes: int) -> None:
    check_piece_size(chunk_bytes)


@pytest.mark.parametrize("chunk_bytes", [0, 1024, 256 * 1024 + 1024, 64 * 1024 * 1024])
def test_pieces_the_kernels_cannot_take_are_refused(chunk_bytes: int) -> None:
    with pytest.raises(ValueError, match="GPU chunk digests need pieces"):
        check_piece_size(chunk_bytes)
