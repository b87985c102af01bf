// The end of a query block's online softmax that both families share: O divided by its rows' sums,
// and the rows' log-sum-exp where the call asks for it (float32, at ForwardParams::lse's strides).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/forward_params.h"
#include "common/online_softmax.cuh"

namespace flash {

// A warp's rows, from first_row + warp_first_row of (batch, head); the block's rows at or past
// first_row + valid_rows do not exist. The log-sum-exp goes to lse (null: not asked for; params.lse,
// or a split's partial buffer) at params' lse strides. valid_rows is a number, or a callable that
// gives it, called only where the log-sum-exp is stored (so its computation stays in that branch).
template <typename Softmax, typename OAccumulators, typename ValidRows>
__device__ __forceinline__ void finish_softmax(const Softmax &softmax, OAccumulators &O_acc, float score_scale,
                                               float *lse, const ForwardParams &params, int batch, int head,
                                               int first_row, int warp_first_row, ValidRows valid_rows) {
    softmax.normalize(O_acc);
    if (lse != nullptr) {
        int rows;
        if constexpr (std::is_invocable_v<ValidRows>)
            rows = valid_rows();
        else
            rows = valid_rows;
        store_log_sum_exp(softmax, score_scale,
                          lse + batch * params.lse_batch_stride + head * params.lse_head_stride + first_row,
                          warp_first_row, rows);
    }
}

} // namespace flash
