// Where a tile's elements live: shared-memory tiles addressed by (row, column), and the register
// arrays holding one warp's mma.sync B fragments (common/fragments.cuh has the A fragments and
// the accumulators, which the Hopper family shares).
#pragma once

#include <cstdint>

#include "common/fragments.cuh"
#include "common/swizzling.cuh"

namespace flash::sm80 {

// A row-major rows x cols tile of 16-bit elements in shared memory. conflict_free lays it out so
// that the eight rows one ldmatrix or cp.async phase touches at one column fall into different
// banks: rows of a multiple of 128 bytes get their 16-byte chunks XOR-swizzled (swizzling.cuh);
// other rows (d_head 32 or 96) get one 16-byte chunk of padding, which shifts each row's banks by
// one chunk instead. Every access goes through at(), so the layout is decided here alone.
template <typename value_t_, int rows_, int cols_, bool conflict_free>
struct SmemTile {
    using value_t = value_t_;
    static constexpr int rows = rows_;
    static constexpr int cols = cols_;
    static constexpr bool swizzled = conflict_free && cols % (SWIZZLE_CHUNKS * ELEMS_PER_COPY) == 0;
    static constexpr bool padded = conflict_free && !swizzled;
    static constexpr int row_stride = cols + (padded ? ELEMS_PER_COPY : 0); // elements from one row to the next
    static constexpr int row_bytes = row_stride * static_cast<int>(sizeof(value_t));
    static constexpr int size = rows * row_stride;

    value_t *data;

    __device__ __forceinline__ value_t *at(int row, int col) const {
        if constexpr (swizzled)
            return data + row * row_stride + swizzled_col<cols>(row, col);
        else
            return data + row * row_stride + col;
    }
};

// B-operand fragments of one warp: N_tiles 8-column tiles x K_slices 16-deep k-slices,
// 2 registers (4 elements) per lane each, in the m16n8k16 B layout.
template <int N_tiles_, int K_slices_>
struct FragmentsB {
    static constexpr int N_tiles = N_tiles_;
    static constexpr int K_slices = K_slices_;
    uint32_t r[N_tiles][K_slices][2];
};

} // namespace flash::sm80
