// The Hopper family's varlen work plan (sm90/varlen_work_plan.cuh) of a batch, written by the same
// planning kernel a varlen call launches and returned as a tensor: what the tests compare with the
// order's model (tools/analysis/work_order_tail.py), and what a kernel engineer reads to see in which
// order a batch's work tiles run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/sequences.h"
#include "common/forward_params.h"
#include "common/sequence.cuh"
#include "sm90/varlen_work_plan.cuh"

namespace flash::binding {

// Columns of the returned plan, one row per work tile in the order the attention kernel takes them:
// its sequence, query head, the cluster's first query block and the sequence's query blocks, then
// the sequence's rows (start and length of q's, start and length of k's), as PlannedTile holds them.
constexpr int PLANNED_TILE_FIELDS = sizeof(sm90::PlannedTile) / sizeof(int);
static_assert(PLANNED_TILE_FIELDS == 8, "PlannedTile is eight ints: the docstring of varlen_work_plan lists them");

inline at::Tensor varlen_work_plan(const at::Tensor &cu_seqlens_q, const at::Tensor &cu_seqlens_k, int heads_q,
                                   int heads_kv, int B_r, int cluster, bool masked, int KV_row_bytes) {
    if (!cu_seqlens_q.is_cuda())
        throw py::value_error("cu_seqlens_q: expected a CUDA tensor, got one on " + cu_seqlens_q.device().str());
    if (cu_seqlens_q.dim() != 1 || cu_seqlens_q.size(0) < 2)
        throw py::value_error("cu_seqlens_q: shape " + shape_str(cu_seqlens_q) + " must be (batch + 1,) with batch >= 1");
    const int64_t batch = cu_seqlens_q.size(0) - 1;
    check_sequence_tensor(cu_seqlens_q, "cu_seqlens_q", batch + 1, cu_seqlens_q, true);
    check_sequence_tensor(cu_seqlens_k, "cu_seqlens_k", batch + 1, cu_seqlens_q, true);
    if (heads_q < 1 || heads_kv < 1 || heads_q % heads_kv != 0)
        throw py::value_error("heads_q, heads_kv: must be positive, heads_kv dividing heads_q; got " +
                              std::to_string(heads_q) + ", " + std::to_string(heads_kv));
    if (B_r < 1 || cluster < 1 || KV_row_bytes < 1)
        throw py::value_error("B_r, cluster, KV_row_bytes: must be positive; got " + std::to_string(B_r) + ", " +
                              std::to_string(cluster) + ", " + std::to_string(KV_row_bytes));
    const c10::cuda::CUDAGuard guard(cu_seqlens_q.device());

    // The rows the sequences may use, and at most how many tiles they have (the layout's capacity),
    // from the offsets as the kernel clamps them: each sequence's slot inside rows_q.
    const at::Tensor offsets_q = cu_seqlens_q.cpu();
    const at::Tensor offsets_k = cu_seqlens_k.cpu();
    const int *q = offsets_q.data_ptr<int>();
    const int rows_q = std::max(q[batch], 0);
    const int rows_k = std::max(offsets_k.data_ptr<int>()[batch], 0);
    int64_t capacity = 0;
    for (int b = 0; b < batch; ++b) {
        const int length = used_rows(q, nullptr, nullptr, rows_q, b).length;
        const int64_t Q_blocks = (length + B_r - 1) / B_r;
        capacity += (Q_blocks + cluster - 1) / cluster * heads_q;
    }

    ForwardParams params{};
    params.batch = static_cast<int>(batch);
    params.heads_q = heads_q;
    params.heads_kv = heads_kv;
    params.sequences.cu_seqlens_q = cu_seqlens_q.data_ptr<int>();
    params.sequences.cu_seqlens_k = cu_seqlens_k.data_ptr<int>();
    params.sequences.rows_q = rows_q;
    params.sequences.rows_k = rows_k;
    params.sequences.kv_batches = 1;
    const sm90::VarlenPlanLayout layout{std::max<int64_t>(capacity, 1), static_cast<int>(batch)};
    const at::Tensor scratch = at::empty({layout.bytes()}, cu_seqlens_q.options().dtype(at::kByte));
    params.scratch = scratch.data_ptr();
    sm90::plan_varlen_work(params, layout, B_r, cluster, masked, KV_row_bytes,
                           at::cuda::getCurrentCUDAStream(cu_seqlens_q.device().index()).stream());

    const at::Tensor words = scratch.view(at::kInt);
    const int64_t count = words[0].item<int>();
    constexpr int64_t header_words = sm90::VarlenPlanLayout::header_bytes / sizeof(int);
    return words.narrow(0, header_words, count * PLANNED_TILE_FIELDS).view({count, PLANNED_TILE_FIELDS}).clone();
}

} // namespace flash::binding
