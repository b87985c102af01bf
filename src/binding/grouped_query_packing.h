// One query per sequence with grouped heads (decoding with GQA or MQA): the heads_q / heads_kv query
// heads that share a key/value head become the rows of one sequence of that head, so a block reads
// each K and V tile once for the whole group instead of once per query head. q (batch, 1, heads_q,
// d_head) is viewed as (batch, group, heads_kv, d_head), and o likewise: no copy, since the
// group's heads are neighbours in memory. The log-sum-exp (batch, heads_kv, group) is the call's
// (batch, heads_q, 1) in the same memory.
//
// The rows of a packed sequence are one query, so nothing may tell them apart: no ALiBi (a slope
// per query head) and no bounded left window (each row would get a diagonal of its own). A causal
// mask or a right window changes nothing for a single query aligned to the last key, so it runs as
// no mask. Calls with per-sequence query rows (cu_seqlens_q, seqused_q, leftpad_q) are not packed.
#pragma once

#include <cstdint>
#include <optional>

#include <torch/extension.h>

#include "binding/problem.h"
#include "binding/sequences.h"

namespace flash::binding {

struct GroupedQueryPacking {
    int64_t group = 1; // query heads per key/value head; 1: not packed

    // q, k and v in the batch layout; calls whose tensors disagree are not packed, so that their
    // checks name the call's shapes.
    GroupedQueryPacking(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                        const std::optional<at::Tensor> &o_given, const ProblemArguments &args,
                        const SequenceArguments &sequences) {
        const bool shapes = q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() &&
                            (q.size(0) == k.size(0) || sequences.kv_batches_indexed()) &&
                            q.size(1) == 1 && q.size(3) == k.size(3) && k.size(2) > 0 && q.size(2) > k.size(2) &&
                            q.size(2) % k.size(2) == 0 && q.scalar_type() == k.scalar_type() &&
                            q.scalar_type() == v.scalar_type() && q.device() == k.device() && q.device() == v.device();
        const bool one_query_row = !sequences.packed() && !sequences.seqused_q && !sequences.leftpad_q;
        const bool o_fits = !o_given || o_given->sizes() == q.sizes();
        if (shapes && o_fits && one_query_row && !args.alibi_slopes && args.window.left == -1)
            group = q.size(2) / k.size(2);
    }

    bool active() const { return group > 1; }

    // (batch, 1, heads_q, d) -> (batch, group, heads_kv, d), a view (o is allocated in the call's
    // layout and packed, so the output needs no unpacking).
    at::Tensor pack(const at::Tensor &t) const {
        return t.unflatten(2, {t.size(2) / group, group}).squeeze(1).transpose(1, 2);
    }

    // The packed call's problem: one query, so no mask.
    ProblemArguments arguments(ProblemArguments args) const {
        args.causal = false;
        args.window = Window{-1, -1};
        return args;
    }

    // lse (batch, heads_kv, group) -> the call's (batch, heads_q, 1).
    at::Tensor unpack_lse(const at::Tensor &lse) const { return lse.flatten(1, 2).unsqueeze(2); }
};

} // namespace flash::binding
