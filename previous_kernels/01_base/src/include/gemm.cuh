// Warp-level matrix products on register fragments, and the float32 -> 16-bit conversion that
// turns one product's accumulators into the next product's A operand.
#pragma once

#include "layout.cuh"
#include "ptx.cuh"
#include "type_utils.cuh"

namespace flash {

// acc += A[:, a_first_slice : a_first_slice + K_slices] * B, all B's k-slices.
template <typename value_t, int M, int N, int A_slices, int K_slices>
__device__ __forceinline__ void warp_gemm(Accumulators<M, N> &acc, const FragmentsA<M, A_slices> &a,
                                          int a_first_slice, const FragmentsB<N, K_slices> &b) {
#pragma unroll
    for (int k = 0; k < K_slices; ++k)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int n = 0; n < N; ++n)
                ptx::mma_m16n8k16<value_t>(acc.r[m][n], a.r[m][a_first_slice + k], b.r[n][k]);
}

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
