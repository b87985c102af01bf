// The XOR swizzle of shared-memory tiles. A tile row of d_head 16-bit elements is 128 or 256
// bytes, so the eight rows that one ldmatrix phase (or one 8-thread cp.async phase) touches at
// the same column fall into the same four banks: an eight-way conflict. XOR-ing a row's 16-byte
// chunk index with (row % 8) puts those eight chunks into eight different bank groups while
// keeping every chunk, and the 8 elements inside it, contiguous.
#pragma once

#include "common/common.h"

namespace flash {

// Bank groups of 16 bytes in one 128-byte pass over the 32 four-byte banks.
constexpr int SWIZZLE_CHUNKS = 8;

// Element offset of (row, col) within a row of `cols` elements, with the row's 16-byte chunks
// permuted by XOR with row % 8.
template <int cols>
__device__ __forceinline__ int swizzled_col(int row, int col) {
    static_assert(cols % (SWIZZLE_CHUNKS * ELEMS_PER_COPY) == 0, "a swizzled row needs a multiple of 8 chunks");
    const int chunk = col / ELEMS_PER_COPY;
    return ((chunk ^ (row % SWIZZLE_CHUNKS)) * ELEMS_PER_COPY) | (col % ELEMS_PER_COPY);
}

} // namespace flash
