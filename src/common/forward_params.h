// The parameter block of one forward call: built once by the binding, read by every kernel family.
// Plain C++ (no torch, no CUDA headers), so kernels, launchers and the binding share it.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/fast_division.h"

namespace flash {

// Element strides of one (batch, seq, heads, d_head) tensor; the last dimension is contiguous.
struct TensorStrides {
    int64_t batch;
    int64_t seq;
    int64_t head;
};

// Which (query, key) pairs a call lets attend, beyond the lengths, and what is applied to the
// scores (FlashAttention-2's semantics: the mask is aligned to the bottom-right corner of the score
// matrix, so query i's diagonal is key i + seqlen_k - seqlen_q; ForwardParams::rows_per_query says
// which query a row is).
struct MaskParams {
    // Query i attends keys i + seqlen_k - seqlen_q - window_left .. i + seqlen_k - seqlen_q +
    // window_right: read by the CAUSAL (window_right = 0) and LOCAL variants. An unbounded side is
    // UNBOUNDED_WINDOW, which reaches past every key.
    int window_left;
    int window_right;
    float softcap;              // > 0: scores become softcap * tanh(score / softcap); 0: off
    const float *alibi_slopes;  // null, or per (batch, head_q): -slope * |i + seqlen_k - seqlen_q - j| is added
    int64_t alibi_batch_stride; // 0 when the slopes are shared by the whole batch
};

// The window of a side that is not bounded: larger than any distance between a query's diagonal
// and a key while seqlen_q and seqlen_k are at most MAX_SEQLEN.
constexpr int MAX_SEQLEN = 1 << 29;
constexpr int UNBOUNDED_WINDOW = 2 * MAX_SEQLEN;

// A paged KV cache (both families' varlen variants read it): k and v are pools of pages,
// (num_pages, page_size, heads_kv, d_head), and sequence b's key j is row j % page_size of page
// block_table[b * table_stride + j / page_size]. A sequence holds at most pages_per_sequence *
// page_size keys; the kernels clamp a table entry to the pages that exist.
struct PagedKV {
    // page_size is a multiple of this many rows (the binding checks): a kernel may copy keys in
    // groups of that many, none of which straddles two pages.
    static constexpr int ROWS_MULTIPLE = 16;

    const int *block_table; // (batch, pages_per_sequence) int32; null: k and v are not paged
    int64_t table_stride;
    int pages_per_sequence;
    int page_size;
    int num_pages;
};

// Where each sequence of a batch lies, when the sequences have lengths of their own (the varlen
// variant; common/sequence.cuh reads it). Each batch entry b has a slot of rows in q's (and o's)
// seq dimension: rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of a tensor whose batch dimension is
// 1, or, without cu_seqlens_q, the whole seq dimension of batch entry b. The sequence uses the
// slot's rows from leftpad_q[b] on (0 without leftpad), seqused_q[b] of them (without seqused, the
// rest of the slot). The same for k and v, whose slot is batch entry kv_batch_idx[b] where that is
// given (a cache with more entries than the batch), and whose keys are paged where `paged` says so
// (cu_seqlens_k then gives lengths only: every sequence's keys start at its first page). Every
// pointer is null or the call's int32 array.
struct SequenceLayout {
    const int *cu_seqlens_q; // (batch + 1)
    const int *cu_seqlens_k;
    const int *seqused_q; // (batch)
    const int *seqused_k;
    const int *leftpad_q; // (batch)
    const int *leftpad_k;
    const int *kv_batch_idx; // (batch)
    // The rows of q's and k's seq dimension (paged: a sequence's pages' rows), and the batch
    // entries of k: every slot is clamped to them, so that lengths, offsets and indices that break
    // the rules never reach memory outside the tensors.
    int rows_q;
    int rows_k;
    int kv_batches;
    PagedKV paged;
};

// A split over the keys (split-KV, for few query rows against many keys): num_splits blocks share
// each query block's key tiles, in contiguous runs of equal length, and each writes its rows'
// output, normalized by its own sums, and log-sum-exp in float32 to its split's partial buffers;
// a combine kernel (split_kv/combine.h) then merges them into o and lse. The partial output of
// split s has o's element strides, at o_partial + s * o_split_stride; its log-sum-exp has lse's
// strides (always set when splitting), at lse_partial + s * lse_split_stride. Read by the varlen
// variant of the SM80 family only.
struct SplitKV {
    int num_splits = 1; // 1: no split
    float *o_partial;
    float *lse_partial;
    int64_t o_split_stride;
    int64_t lse_split_stride;
};

// One FP8 input's dequantisation factors (FlashAttention-3's q_descale, k_descale, v_descale): the
// input's values times its factor for (batch, kv head) are the values attended with. float32, element
// (b, h) at b * batch_stride + h * head_stride; a null pointer stands for factors of 1.
struct Descale {
    const float *data;
    int64_t batch_stride;
    int64_t head_stride;
};

// q's, k's and v's descales, read by the kernels of FP8 (E4M3) inputs only.
struct Descales {
    Descale q;
    Descale k;
    Descale v;
};

struct ForwardParams {
    const void *q; // (batch, seqlen_q, heads_q, d_head)
    const void *k; // (batch, seqlen_k, heads_kv, d_head)
    const void *v; // (batch, seqlen_k, heads_kv, d_head)
    void *o;       // (batch, seqlen_q, heads_q, d_head)
    // null, or the rows' natural-log sum of exp: element (batch, head, row) at
    // batch * lse_batch_stride + head * lse_head_stride + row.
    float *lse;
    int64_t lse_batch_stride;
    int64_t lse_head_stride;
    TensorStrides q_strides;
    TensorStrides k_strides;
    TensorStrides v_strides;
    TensorStrides o_strides;
    int batch;
    // With per-sequence lengths (varlen), the longest sequence's: what the grid covers.
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int heads_kv; // divides heads_q: query head h reads key/value head h / (heads_q / heads_kv)
    int d_head;
    // Consecutive rows that are one query (the query heads of a group, packed as rows: row r is
    // query r / rows_per_query of seqlen_q / rows_per_query): the mask's diagonals are the queries'.
    int rows_per_query = 1;
    float softmax_scale; // multiplies Q K^T before the softmax
    MaskParams mask;
    // The dtypes of q, of k and v (q's, or E4M3 for an FP8 cache beside 16-bit q) and of o (q's, or
    // for FP8 inputs the 16-bit type the call asks for).
    DType q_dtype;
    DType kv_dtype;
    DType o_dtype;
    Descales descales;
    SequenceLayout sequences; // read by the varlen variant only
    SplitKV split;
    // A zeroed counter in device memory for a kernel that hands out its work tiles as blocks ask for
    // them (ForwardLauncher::needs_work_counter); null for the others.
    int *work_counter;
    // Where a query's rows start in q and o, for kernels that read rows query by query
    // (ForwardLauncher::reads_grouped_rows): row r of a (batch, head) lies at (r / rows_per_query) *
    // query stride + (r % rows_per_query) * the strides' seq. With one row per query the query
    // stride is seq's; grouped heads packed as rows are read in the call's q and o (batch, queries,
    // heads_q, d_head) in place, the head being the group's first.
    int64_t q_query_stride;
    int64_t o_query_stride;
    // rows_per_query's reciprocal, which the kernels divide by (set_rows_per_query sets both).
    Reciprocal rows_per_query_reciprocal;
    // Global memory of the kernel's own for this call, uninitialized
    // (ForwardLauncher::scratch_bytes); null where it needs none.
    void *scratch;
};

inline void set_rows_per_query(ForwardParams &params, int rows) {
    params.rows_per_query = rows;
    params.rows_per_query_reciprocal = reciprocal_of(rows);
}

} // namespace flash
