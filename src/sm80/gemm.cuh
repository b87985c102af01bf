// Warp-level matrix products on register fragments.
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

} // namespace flash::sm80
