// The SM80 epilogue's store of O: staged through the Q tile so the global stores are full
// 16-byte, coalesced rows.
#pragma once

#include <cstdint>

#include "sm80/load_store.cuh"

namespace flash::sm80 {

// O's rows of the block go to `O` (row stride O_row_stride); with masked tails, rows at or past
// valid_rows and columns at or past valid_cols (the call's d_head) do not exist.
template <typename Kernel, bool MASKED_TAILS>
__device__ __forceinline__ void store_O(typename Kernel::value_t *O, int64_t O_row_stride,
                                        const typename Kernel::Q_tile &Q_smem,
                                        const typename Kernel::O_accumulators &O_acc, int warp_first_row,
                                        int valid_rows, int valid_cols) {
    __syncthreads(); // every warp is done with Q
    store_accumulators(Q_smem, O_acc, warp_first_row);
    __syncthreads();
    copy_shared_to_global<Kernel::n_threads, MASKED_TAILS, MASKED_TAILS>(O, O_row_stride, Q_smem, valid_rows, valid_cols);
}

} // namespace flash::sm80
