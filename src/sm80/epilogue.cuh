// The SM80 epilogue's store of O: staged through the Q tile so the global stores are full
// 16-byte, coalesced rows.
#pragma once

#include <cstdint>

#include "sm80/load_store.cuh"

namespace flash::sm80 {

// O's rows of the block go out through the Q tile: copy_out(Q_smem) copies them to global memory
// once the accumulators of every warp that holds results (warp_holds_result) are in it.
template <typename Kernel, typename CopyOut>
__device__ __forceinline__ void store_O(const typename Kernel::Q_tile &Q_smem, const typename Kernel::O_accumulators &O_acc,
                                        int warp_first_row, bool warp_holds_result, CopyOut &&copy_out) {
    __syncthreads(); // every warp is done with Q
    if (warp_holds_result)
        store_accumulators(Q_smem, O_acc, warp_first_row);
    __syncthreads();
    copy_out(Q_smem);
}

// A split's float32 partial O (SplitKV), straight from the accumulators: each lane's pairs of
// columns as 8-byte stores to row `row` at O_row(row) (once per row: a store may change what it
// reads, so between the stores it would be computed again), rows at or past valid_rows and columns
// at or past valid_cols skipped.
template <int M, int N, typename RowAddress>
__device__ __forceinline__ void store_partial_O(const RowAddress &O_row, const Accumulators<M, N> &O_acc,
                                                int warp_first_row, int valid_rows, int valid_cols) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int lane_row = warp_first_row + lane / QUAD_SIZE;
    const int lane_col = 2 * (lane % QUAD_SIZE);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int row = lane_row + m * MMA_M + half_row * 8;
            if (row >= valid_rows)
                continue;
            float *const O = O_row(row);
#pragma unroll
            for (int n = 0; n < N; ++n) {
                const int col = n * MMA_N + lane_col;
                if (col < valid_cols)
                    *reinterpret_cast<float2 *>(O + col) =
                        make_float2(O_acc.r[m][n][2 * half_row], O_acc.r[m][n][2 * half_row + 1]);
            }
        }
}

} // namespace flash::sm80
