// Decoding with grouped heads (GQA or MQA), up to MAX_PACKED_QUERIES queries per sequence (a decode
// step, or a speculative one): the heads_q / heads_kv query heads that share a key/value head
// become rows of one sequence of that head, so a block reads each K and V tile once for the whole
// group instead of once per query head. q (batch, queries, heads_q, d_head) is seen as (batch,
// queries * group, heads_kv, d_head): row r is query r / group's head r % group of the group
// (ForwardParams::rows_per_query = group, so the mask's diagonals stay the queries'). The call is
// checked in its own layout and its parameter block packed (pack_params); then a kernel that reads
// grouped rows (ForwardLauncher::reads_grouped_rows: the SM80 family's varlen variant, which runs
// decoding) reads q and writes o in place, at a query stride (address_rows). Another kernel gets
// packed q and o: views where one query or one key/value head makes the rows evenly spaced,
// otherwise copies (a few rows per sequence), the output copied back into the call's.
//
// No ALiBi: a slope per query head would tell the rows of a query apart. A single query aligned to
// the last key sees every key through a causal mask or a right window, so those run as no mask.
// Calls with per-sequence query rows (cu_seqlens_q, seqused_q, leftpad_q) are not packed, nor are
// e4m3 calls, which run on the Hopper family's kernels as they come (binding/fp8.h); an FP8 cache's
// (16-bit q) are.
#pragma once

#include <cstdint>
#include <optional>

#include <torch/extension.h>

#include "binding/dtypes.h"
#include "binding/problem.h"
#include "binding/sequences.h"
#include "common/forward_params.h"

namespace flash::binding {

// The most queries per sequence that are packed: speculative decoding's steps.
constexpr int64_t MAX_PACKED_QUERIES = 16;

struct GroupedQueryPacking {
    int64_t group = 1; // query heads per key/value head; 1: not packed
    int64_t queries = 1;

    // q, k and v in the batch layout; calls whose tensors disagree are not packed, so that their
    // checks name the call's shapes.
    GroupedQueryPacking(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                        const std::optional<at::Tensor> &o_given, const ProblemArguments &args,
                        const SequenceArguments &sequences) {
        const bool shapes = q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() &&
                            (q.size(0) == k.size(0) || sequences.kv_batches_indexed()) && q.size(1) >= 1 &&
                            q.size(1) <= MAX_PACKED_QUERIES && q.size(3) == k.size(3) && k.size(2) > 0 &&
                            q.size(2) > k.size(2) && q.size(2) % k.size(2) == 0 && kv_dtypes_agree(q, k, v) &&
                            q.device() == k.device() && q.device() == v.device();
        const bool query_rows_shared = !sequences.packed() && !sequences.seqused_q && !sequences.leftpad_q;
        const bool o_fits = !o_given || o_given->sizes() == q.sizes();
        if (shapes && o_fits && query_rows_shared && !args.alibi_slopes && !is_e4m3(q)) {
            group = q.size(2) / k.size(2);
            queries = q.size(1);
        }
    }

    bool active() const { return group > 1; }

    // The packed problem's parameter block from the call's (checked on q in the call's layout):
    // queries * group rows of heads_kv heads, each query's rows sharing its diagonal.
    void pack_params(ForwardParams &params) const {
        params.seqlen_q = static_cast<int>(params.seqlen_q * group);
        params.heads_q = static_cast<int>(params.heads_q / group);
        set_rows_per_query(params, static_cast<int>(group));
        params.sequences.rows_q = static_cast<int>(params.sequences.rows_q * group);
    }

    // The strides of t (q or o in the call's layout) as a kernel that reads grouped rows addresses
    // them: a row is a head of the group, a packed head a group of heads, and the query stride
    // steps from query to query.
    void address_rows(const at::Tensor &t, TensorStrides &strides, int64_t &query_stride) const {
        strides = TensorStrides{t.stride(0), t.stride(2), group * t.stride(2)};
        query_stride = t.stride(1);
    }

    // (batch, queries, heads_q, d) -> (batch, queries * group, heads_kv, d): where the rows are
    // evenly spaced (packs_in_place), one strided view (row r at head stride * r, a key/value
    // head's rows group head strides apart), else a copy.
    at::Tensor pack(const at::Tensor &t) const {
        if (packs_in_place(t)) {
            TensorStrides strides;
            int64_t query_stride;
            address_rows(t, strides, query_stride);
            return t.as_strided({t.size(0), queries * group, t.size(2) / group, t.size(3)},
                                {strides.batch, strides.seq, strides.head, t.stride(3)}, t.storage_offset());
        }
        return t.unflatten(2, {t.size(2) / group, group}).transpose(2, 3).flatten(1, 2);
    }

    // Whether pack(t) is a view of t: the rows of a query's group (head stride) continue into the
    // next query's (seq stride).
    bool packs_in_place(const at::Tensor &t) const { return queries == 1 || t.stride(1) == group * t.stride(2); }

    // The packed output (batch, queries * group, heads_kv, d) in the call's layout (batch, queries,
    // heads_q, d).
    at::Tensor unpack(const at::Tensor &o) const { return o.unflatten(1, {queries, group}).transpose(2, 3).flatten(2, 3); }

    // The packed call's arguments: a single query needs no causal mask or right window.
    ProblemArguments arguments(ProblemArguments args) const {
        if (queries == 1) {
            args.causal = false;
            args.window.right = -1;
        }
        return args;
    }

    // lse (batch, heads_kv, queries * group) -> the call's (batch, heads_q, queries).
    at::Tensor unpack_lse(const at::Tensor &lse) const {
        return lse.unflatten(2, {queries, group}).transpose(2, 3).flatten(1, 2);
    }
};

} // namespace flash::binding
