// The second step of a split over the keys (SplitKV in common/forward_params.h): merging each
// row's partial outputs and log-sum-exps into o and lse. Shared by every family that splits.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/dtype.h"
#include "common/forward_params.h"

namespace flash {

// Reads the partial buffers of params.split (every row of o's (entry, seq, heads) index space: rows
// no block wrote must hold +infinity in their partial log-sum-exps, which counts as "no key"),
// writes params.o (dtype, call's d_head columns) and, where params.lse is set, the merged
// log-sum-exp. A row no split saw a key of gets zeros and +infinity, as a row without keys always
// does. The sum runs over the splits in order, so the result does not depend on the schedule.
// o has batch_entries entries of `rows` rows (its own dimensions: with cu_seqlens, 1 and total_q).
void combine_splits(DType dtype, const ForwardParams &params, int batch_entries, int rows, cudaStream_t stream);

} // namespace flash
