// Register fragments in the m16n8k16 layouts that mma.sync and wgmma share: a warp's A operand
// and its float32 accumulators (wgmma's m64nN accumulators are, per warp, N/8 such 16x8 tiles),
// and the conversion that turns one product's accumulators into the next product's A operand.
#pragma once

#include <cstdint>

#include "common/type_utils.cuh"

namespace flash {

// A-operand fragments of one warp: M_tiles 16-row tiles x K_slices 16-wide k-slices,
// 4 registers (8 elements) per lane each, in the m16n8k16 A layout.
template <int M_tiles_, int K_slices_>
struct FragmentsA {
    static constexpr int M_tiles = M_tiles_;
    static constexpr int K_slices = K_slices_;
    uint32_t r[M_tiles][K_slices][4];
};

// float32 accumulators of one warp: M_tiles x N_tiles 16x8 tiles, 4 registers per lane each.
// Lane l holds rows l/4 (registers 0, 1) and l/4 + 8 (registers 2, 3), columns 2*(l%4) + {0, 1}.
template <int M_tiles_, int N_tiles_>
struct Accumulators {
    static constexpr int M_tiles = M_tiles_;
    static constexpr int N_tiles = N_tiles_;
    float r[M_tiles][N_tiles][4];

    // visit(index, value) for every register, tile by tile (row tiles outer), index counting them
    // from 0 in that order.
    template <typename Visit>
    __device__ __forceinline__ void for_each(Visit &&visit) {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int n = 0; n < N_tiles; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    visit((m * N_tiles + n) * 4 + i, r[m][n][i]);
    }

    __device__ __forceinline__ void zero() {
        for_each([](int, float &value) { value = 0.0f; });
    }

    __device__ __forceinline__ void scale(float factor) {
        for_each([factor](int, float &value) { value *= factor; });
    }
};

// The accumulator layout of two neighbouring 16x8 tiles is the A layout of one 16x16 slice, so
// the probabilities P = softmax(S) feed the P*V product straight from registers.
template <typename value_t, int M, int N>
__device__ __forceinline__ void accumulators_to_A(FragmentsA<M, N / 2> &a, const Accumulators<M, N> &acc) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int k = 0; k < N / 2; ++k) {
            const float(&left)[4] = acc.r[m][2 * k];
            const float(&right)[4] = acc.r[m][2 * k + 1];
            a.r[m][k][0] = pack_pair<value_t>(left[0], left[1]);
            a.r[m][k][1] = pack_pair<value_t>(left[2], left[3]);
            a.r[m][k][2] = pack_pair<value_t>(right[0], right[1]);
            a.r[m][k][3] = pack_pair<value_t>(right[2], right[3]);
        }
}

} // namespace flash
