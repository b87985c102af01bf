// One sequence of a batch, as a block sees it: its rows in the tensors, and the parameter block
// with its own lengths. Dense problems (every sequence has the call's lengths) keep the call's
// parameter block as it is; the varlen variant (SequenceLayout) reads each sequence's slot and
// clamps it to the tensors, so that offsets and lengths that break the rules stay in bounds.
#pragma once

#include <cstdint>

#include "common/common.h"
#include "common/forward_params.h"

namespace flash {

// The rows a sequence uses on one side (q and o, or k and v): start .. start + length - 1 of its
// batch entry's seq dimension.
struct UsedRows {
    int start;
    int length;
};

// Both sides' rows of one sequence.
struct SequenceRows {
    UsedRows q;
    UsedRows k;
};

// The slot of batch entry `batch` (cu_seqlens, or the whole seq dimension), then leftpad and
// seqused, each clamped to what remains. On the host too, where a buffer must hold what the kernel
// writes for these rows (binding/varlen_work_plan.h).
__host__ __device__ __forceinline__ UsedRows used_rows(const int *cu_seqlens, const int *seqused, const int *leftpad,
                                                       int rows, int batch) {
    int start = 0;
    int end = rows;
    if (cu_seqlens != nullptr) {
        start = min(max(cu_seqlens[batch], 0), rows);
        end = min(max(cu_seqlens[batch + 1], start), rows);
    }
    if (leftpad != nullptr)
        start += min(max(leftpad[batch], 0), end - start);
    int length = end - start;
    if (seqused != nullptr)
        length = min(max(seqused[batch], 0), length);
    return {start, length};
}

// The keys of a sequence in a paged cache: every sequence's start at its first page, so
// cu_seqlens_k gives only their count (cu_seqlens_k[b + 1] - cu_seqlens_k[b]), seqused_k as
// elsewhere; without either, as many as its pages hold. At most that many.
__device__ __forceinline__ UsedRows paged_rows(const SequenceLayout &layout, int batch) {
    const int capacity = layout.paged.pages_per_sequence * layout.paged.page_size;
    int64_t length = capacity;
    if (layout.cu_seqlens_k != nullptr)
        length = max(static_cast<int64_t>(layout.cu_seqlens_k[batch + 1]) - layout.cu_seqlens_k[batch], int64_t{0});
    if (layout.seqused_k != nullptr)
        length = min(static_cast<int64_t>(max(layout.seqused_k[batch], 0)), length);
    return {0, static_cast<int>(min(length, static_cast<int64_t>(capacity)))};
}

// Sequence `batch`'s row of a paged cache's block table.
__device__ __forceinline__ const int *page_table_row(const PagedKV &paged, int batch) {
    return paged.block_table + batch * paged.table_stride;
}

// The page holding page `slot` of a sequence's keys, from its row of the block table: the entry,
// clamped into the pool, at a column clamped into the row (slots past the sequence are not read),
// so that a bad entry (-1 padding, or past the pool) never reads outside the tensors.
__device__ __forceinline__ int page_at(const PagedKV &paged, const int *table_row, int slot) {
    return min(max(table_row[min(slot, paged.pages_per_sequence - 1)], 0), paged.num_pages - 1);
}

// Row `row`'s offset from row 0 of a (batch, head) of q or o, whose queries are query_stride apart
// and a query's rows seq_stride apart (ForwardParams::q_query_stride).
__device__ __forceinline__ int64_t row_offset(int row, int64_t seq_stride, int64_t query_stride, const ForwardParams &params) {
    const int query = divided(row, params.rows_per_query_reciprocal);
    return query * query_stride + (row - query * params.rows_per_query) * seq_stride;
}

// Both sides' rows of sequence `batch`, clamped to the tensors.
__device__ __forceinline__ SequenceRows sequence_rows(const SequenceLayout &layout, int batch) {
    return {used_rows(layout.cu_seqlens_q, layout.seqused_q, layout.leftpad_q, layout.rows_q, batch),
            layout.paged.block_table != nullptr
                ? paged_rows(layout, batch)
                : used_rows(layout.cu_seqlens_k, layout.seqused_k, layout.leftpad_k, layout.rows_k, batch)};
}

template <bool VARLEN>
struct Sequence;

// Dense: the call's lengths, every sequence at row 0 of its batch entry.
template <>
struct Sequence<false> {
    const ForwardParams &params;
    int batch;

    __device__ __forceinline__ Sequence(const ForwardParams &params_, int batch_) : params(params_), batch(batch_) {}
    __device__ __forceinline__ int tensor_batch_k() const { return batch; }
};

// A sequence with lengths of its own. `params` is the call's, with this sequence's lengths and the
// pointers of q, k, v, o and lse moved to its first rows, so the kernels' code for one dense
// sequence runs it unchanged; the window's sides stay the call's (bounded as the longest sequence
// needs, which every shorter one computes alike).
template <>
struct Sequence<true> {
    ForwardParams params;
    int batch;
    UsedRows q_rows;
    UsedRows k_rows;

    __device__ __forceinline__ Sequence(const ForwardParams &call, int batch_)
        : Sequence(call, batch_, sequence_rows(call.sequences, batch_)) {}
    // A sequence whose rows were read from the layout already (by the Hopper family's varlen work plan).
    __device__ __forceinline__ Sequence(const ForwardParams &call, int batch_, SequenceRows rows)
        : params(call), batch(batch_), q_rows(rows.q), k_rows(rows.k) {
        params.seqlen_q = q_rows.length;
        params.seqlen_k = k_rows.length;
        params.q = moved(call.q, q_rows.start * call.q_strides.seq, element_bytes(call.q_dtype));
        params.o = const_cast<void *>(moved(call.o, q_rows.start * call.o_strides.seq, element_bytes(call.o_dtype)));
        params.k = moved(call.k, k_rows.start * call.k_strides.seq, element_bytes(call.kv_dtype));
        params.v = moved(call.v, k_rows.start * call.v_strides.seq, element_bytes(call.kv_dtype));
        if (call.lse != nullptr)
            params.lse = call.lse + q_rows.start;
        if (call.split.num_splits > 1) {
            params.split.o_partial = call.split.o_partial + q_rows.start * call.o_strides.seq;
            params.split.lse_partial = call.split.lse_partial + q_rows.start;
        }
    }
    // The batch coordinate of q's and k's tensors: with cu_seqlens their batch dimension is 1, and
    // every slot is in entry 0; k's is kv_batch_idx's entry where that is given; a paged cache's
    // is a page, which the table gives key by key (0 here).
    __device__ __forceinline__ int tensor_batch_q() const { return params.sequences.cu_seqlens_q ? 0 : batch; }
    __device__ __forceinline__ int tensor_batch_k() const {
        const SequenceLayout &layout = params.sequences;
        if (layout.cu_seqlens_k != nullptr || layout.paged.block_table != nullptr)
            return 0;
        return layout.kv_batch_idx ? min(max(layout.kv_batch_idx[batch], 0), layout.kv_batches - 1) : batch;
    }

  private:
    __device__ __forceinline__ static const void *moved(const void *pointer, int64_t elements, int bytes_per_element) {
        return static_cast<const uint8_t *>(pointer) + elements * bytes_per_element;
    }
};

} // namespace flash
