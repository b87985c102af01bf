// Warp-level matrix products on register fragments, and the float32 -> 16-bit conversion that
// turns one product's accumulators into the next product's A operand.
#pragma once

#include "common/ptx.cuh"
#include "common/type_utils.cuh"
#include "sm80/layout.cuh"

namespace flash::sm80 {

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

// A product over n_chunks k-chunks: load(c, fragments) brings chunk c's operands from shared
// memory into registers, multiply(c, fragments) issues its MMAs. With double_buffer, chunk c + 1
// is loaded into the second of two fragment sets before chunk c's MMAs are issued, so the
// ldmatrix latency hides behind tensor-core work instead of stalling it.
template <int n_chunks, bool double_buffer, typename Fragments, typename Load, typename Multiply>
__device__ __forceinline__ void chunked_product(Load &&load, Multiply &&multiply) {
    if constexpr (double_buffer && n_chunks > 1) {
        Fragments fragments[2];
        load(0, fragments[0]);
#pragma unroll
        for (int c = 0; c < n_chunks; ++c) {
            if (c + 1 < n_chunks)
                load(c + 1, fragments[(c + 1) % 2]);
            multiply(c, fragments[c % 2]);
        }
    } else {
#pragma unroll
        for (int c = 0; c < n_chunks; ++c) {
            Fragments fragments;
            load(c, fragments);
            multiply(c, fragments);
        }
    }
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

} // namespace flash::sm80
