// The second step of a split over the keys (SplitKV in common/forward_params.h): merging each
// row's partial outputs and log-sum-exps into o and lse. Shared by every family that splits.
#pragma once

#include <cuda_runtime.h>

#include "common/dtype.h"
#include "common/forward_params.h"

namespace flash {

// The most splits a call takes (each lane of the combine's warp per row holds the partial
// log-sum-exps of MAX_SPLITS / 32 splits in registers, and the partial buffers grow with the count).
constexpr int MAX_SPLITS = 128;

// Reads the partial buffers of params.split for the rows of every sequence (params.sequences, as
// the forward kernel reads them; the varlen layout), writes params.o (dtype, params.d_head columns,
// a multiple of 4) and, where params.lse is set, the merged log-sum-exp. A row no split saw a key
// of gets zeros and +infinity, as a row without keys always does; rows past a sequence's end are
// left as they are. The sum runs over the splits in a fixed order, so the result does not depend
// on the schedule.
void combine_splits(DType dtype, const ForwardParams &params, cudaStream_t stream);

} // namespace flash
