"""BLAKE3 chunk digests of bytes already in device memory, computed on the GPU (CuPy kernels).

`device_chunk_digests(buffer, size, chunk_bytes)` returns the BLAKE3 hex digest of each
`chunk_bytes` piece of the first `size` bytes of a device buffer, in order: what
`core.chunkdigests` records for the same bytes on the host. It lets a device read check the bytes
the runtime will get where they lie, after the fastest raw read there is (`core.deviceread`): no
second pass over the page cache on the host's cores, and no window between the bytes checked and
the bytes used.

BLAKE3 as its specification defines it (hash mode, no key; 1 KiB chunks of 64-byte blocks, a
left-balanced binary tree of parents, ROOT on the last compression): one thread hashes one 1 KiB
chunk; a block of 256 threads merges its chunks' chaining values in shared memory, pairwise level
by level with an odd node carried up (which builds exactly BLAKE3's left-balanced tree, because
every block but a piece's last holds a power-of-two number of chunks aligned to its size); a
second kernel merges a piece's block values the same way. `chunk_bytes` must be a multiple of
256 KiB, at most 32 MiB. bench/gpu/device_read.py checks the kernels against the `blake3`
package on the H200 for sizes around every boundary before it times anything; CUDA cannot run in
CI, so this module has no CI test of its own beyond its argument checks.
"""

from __future__ import annotations

from typing import Any

LEAF_BYTES = 1024
BLOCK_LEAVES = 256  # chunks (1 KiB) per thread block of the leaf kernel
BLOCK_BYTES = LEAF_BYTES * BLOCK_LEAVES
MAX_BLOCKS_PER_PIECE = 128  # the root kernel merges at most this many block values in one block

_SOURCE = r"""
#define CHUNK_START 1u
#define CHUNK_END 2u
#define PARENT 4u
#define ROOT 8u
__constant__ unsigned int IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                                   0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

__device__ __forceinline__ unsigned int rotr(unsigned int x, int n) { return (x >> n) | (x << (32 - n)); }

#define G(a, b, c, d, x, y)                                                                   \
  a = a + b + x; d = rotr(d ^ a, 16); c = c + d; b = rotr(b ^ c, 12);                        \
  a = a + b + y; d = rotr(d ^ a, 8); c = c + d; b = rotr(b ^ c, 7);

__device__ void compress(const unsigned int cv[8], const unsigned int block[16], unsigned long long counter,
                         unsigned int block_len, unsigned int flags, unsigned int out[8]) {
  unsigned int s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
                        IV[0], IV[1], IV[2], IV[3], (unsigned int)counter, (unsigned int)(counter >> 32),
                        block_len, flags};
  unsigned int m[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) m[i] = block[i];
#pragma unroll
  for (int r = 0; r < 7; ++r) {
    G(s[0], s[4], s[8], s[12], m[0], m[1]);
    G(s[1], s[5], s[9], s[13], m[2], m[3]);
    G(s[2], s[6], s[10], s[14], m[4], m[5]);
    G(s[3], s[7], s[11], s[15], m[6], m[7]);
    G(s[0], s[5], s[10], s[15], m[8], m[9]);
    G(s[1], s[6], s[11], s[12], m[10], m[11]);
    G(s[2], s[7], s[8], s[13], m[12], m[13]);
    G(s[3], s[4], s[9], s[14], m[14], m[15]);
    if (r < 6) {
      unsigned int t[16] = {m[2], m[6], m[3], m[10], m[7], m[0], m[4], m[13],
                            m[1], m[11], m[12], m[5], m[9], m[14], m[15], m[8]};
#pragma unroll
      for (int i = 0; i < 16; ++i) m[i] = t[i];
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = s[i] ^ s[i + 8];
}

__device__ void parent_cv(const unsigned int* left, const unsigned int* right, bool root, unsigned int out[8]) {
  unsigned int block[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) { block[i] = left[i]; block[i + 8] = right[i]; }
  compress(IV, block, 0ull, 64u, PARENT | (root ? ROOT : 0u), out);
}

__device__ void chunk_cv(const unsigned char* data, unsigned int len, unsigned long long counter, bool root,
                         unsigned int out[8]) {
  unsigned int cv[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) cv[i] = IV[i];
  unsigned int blocks = (len + 63u) / 64u;
  for (unsigned int b = 0; b < blocks; ++b) {
    unsigned int block_len = min(64u, len - b * 64u);
    unsigned int m[16];
    if (block_len == 64u) {
      const uint4* words = (const uint4*)(data + b * 64u);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint4 w = words[q];
        m[4 * q] = w.x; m[4 * q + 1] = w.y; m[4 * q + 2] = w.z; m[4 * q + 3] = w.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) m[i] = 0u;
      for (unsigned int i = 0; i < block_len; ++i) m[i / 4] |= ((unsigned int)data[b * 64u + i]) << (8 * (i % 4));
    }
    unsigned int flags = (b == 0 ? CHUNK_START : 0u) | (b + 1 == blocks ? CHUNK_END : 0u) |
                         (root && b + 1 == blocks ? ROOT : 0u);
    compress(cv, m, counter, block_len, flags, cv);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = cv[i];
}

// Pairwise, level by level, an odd node carried up: BLAKE3's left-balanced tree over n nodes.
__device__ void merge(unsigned int* cvs, unsigned int n, bool whole) {
  unsigned int t = threadIdx.x;
  while (n > 1) {
    unsigned int half = (n + 1) / 2;
    unsigned int out[8];
    bool active = t < half;
    if (active) {
      if (2 * t + 1 < n) {
        parent_cv(&cvs[16 * t], &cvs[16 * t + 8], whole && half == 1, out);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = cvs[16 * t + i];
      }
    }
    __syncthreads();
    if (active) {
#pragma unroll
      for (int i = 0; i < 8; ++i) cvs[8 * t + i] = out[i];
    }
    __syncthreads();
    n = half;
  }
}

extern "C" __global__ void leaves(const unsigned char* data, unsigned long long size, unsigned long long piece_bytes,
                                  unsigned int* block_cvs) {
  __shared__ unsigned int cvs[256 * 8];
  unsigned long long blocks_per_piece = piece_bytes / (256ull * 1024ull);
  unsigned long long piece = blockIdx.x / blocks_per_piece;
  unsigned long long in_piece = blockIdx.x % blocks_per_piece;
  unsigned long long start = piece * piece_bytes;
  unsigned long long piece_len = min(piece_bytes, size - start);
  unsigned long long leaves_in_piece = (piece_len + 1023ull) / 1024ull;
  unsigned long long first = in_piece * 256ull;
  if (first >= leaves_in_piece) return;  // the whole block lies past a short last piece
  unsigned int n = (unsigned int)min(256ull, leaves_in_piece - first);
  bool whole = leaves_in_piece <= 256ull;  // this block is the piece: its last step is the root
  unsigned int t = threadIdx.x;
  if (t < n) {
    unsigned long long leaf = first + t;
    unsigned long long offset = leaf * 1024ull;
    unsigned int len = (unsigned int)min(1024ull, piece_len - offset);
    unsigned int out[8];
    chunk_cv(data + start + offset, len, leaf, whole && leaves_in_piece == 1ull, out);
#pragma unroll
    for (int i = 0; i < 8; ++i) cvs[8 * t + i] = out[i];
  }
  __syncthreads();
  merge(cvs, n, whole);
  if (t < 8) block_cvs[8 * blockIdx.x + t] = cvs[t];
}

extern "C" __global__ void roots(const unsigned int* block_cvs, unsigned long long size, unsigned long long piece_bytes,
                                 unsigned int* digests) {
  __shared__ unsigned int cvs[128 * 8];
  unsigned long long blocks_per_piece = piece_bytes / (256ull * 1024ull);
  unsigned long long piece = blockIdx.x;
  unsigned long long start = piece * piece_bytes;
  unsigned long long piece_len = min(piece_bytes, size - start);
  unsigned long long leaves_in_piece = (piece_len + 1023ull) / 1024ull;
  unsigned int n = (unsigned int)((leaves_in_piece + 255ull) / 256ull);
  unsigned int t = threadIdx.x;
  if (t < n) {
#pragma unroll
    for (int i = 0; i < 8; ++i) cvs[8 * t + i] = block_cvs[8 * (piece * blocks_per_piece + t) + i];
  }
  __syncthreads();
  merge(cvs, n, true);
  if (t < 8) digests[8 * piece + t] = cvs[t];
}
"""

_kernels: tuple[Any, Any] | None = None


def _compiled() -> tuple[Any, Any]:
    global _kernels
    if _kernels is None:
        import cupy

        module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",))
        _kernels = (module.get_function("leaves"), module.get_function("roots"))
    return _kernels


def check_piece_size(chunk_bytes: int) -> None:
    """ValueError unless the kernels can hash pieces of `chunk_bytes` (a multiple of 256 KiB, at
    most 128 blocks of it)."""
    if chunk_bytes <= 0 or chunk_bytes % BLOCK_BYTES or chunk_bytes // BLOCK_BYTES > MAX_BLOCKS_PER_PIECE:
        raise ValueError(
            f"GPU chunk digests need pieces of a multiple of {BLOCK_BYTES} bytes, at most "
            f"{BLOCK_BYTES * MAX_BLOCKS_PER_PIECE}; not {chunk_bytes}"
        )


def device_chunk_digests(address: int, size: int, chunk_bytes: int) -> list[str]:
    """The BLAKE3 hex digest of each `chunk_bytes` piece of the `size` bytes at device `address`
    (the last piece may be short); [] for size 0. Runs on the current device and stream, and
    returns once the digests are back on the host."""
    check_piece_size(chunk_bytes)
    if size <= 0:
        return []
    import cupy
    import numpy as np

    leaves, roots = _compiled()
    pieces = -(-size // chunk_bytes)
    blocks_per_piece = chunk_bytes // BLOCK_BYTES
    block_cvs = cupy.empty(pieces * blocks_per_piece * 8, dtype=cupy.uint32)
    digests = cupy.empty(pieces * 8, dtype=cupy.uint32)
    data = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(address, size, None), 0)
    leaves((pieces * blocks_per_piece,), (BLOCK_LEAVES,), (data, np.uint64(size), np.uint64(chunk_bytes), block_cvs))
    roots((pieces,), (MAX_BLOCKS_PER_PIECE,), (block_cvs, np.uint64(size), np.uint64(chunk_bytes), digests))
    words = digests.get().astype("<u4").tobytes()
    return [words[32 * i : 32 * (i + 1)].hex() for i in range(pieces)]
