// A decode step's writes before its attention (flash_attn_with_kvcache's k, v and rotary
// arguments): the new keys, rotated, and the new values appended to each sequence's cache in place,
// and the queries rotated, in one kernel launch (a step's work here is a few rows; separate tensor
// operations would cost a launch and microseconds of host time each). The cache holds the tensors'
// 16-bit type, or e4m3 (a quantised cache, read by attention with 16-bit queries): the new rows are
// then quantised as they are written.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/dtype.h"
#include "common/forward_params.h"

namespace flash {

struct AppendParams {
    int batch;
    // Cache rows before this step, per sequence (batch,): the new rows go at seqlens[b] + i, and
    // rotary positions count from there.
    const int *seqlens;

    // New keys and values (batch, new_rows, heads_kv, d_head); new_rows 0: nothing is appended.
    const void *k_new;
    const void *v_new;
    TensorStrides k_new_strides;
    TensorStrides v_new_strides;
    int new_rows;
    int heads_kv;

    // The cache: (entries, entry_rows, heads_kv, d_head), an entry being a sequence's slot, or a
    // page where block_table is set. A sequence holds `capacity` rows; positions past it are
    // clamped into it, and table entries and batch indices into the cache, so nothing is written
    // out of bounds.
    void *k_cache;
    void *v_cache;
    TensorStrides k_cache_strides;
    TensorStrides v_cache_strides;
    int entries;
    int entry_rows;
    int capacity;
    const int *batch_idx;   // null, or (batch,): the entry sequence b writes
    const int *block_table; // null, or (batch, pages per sequence)
    int64_t block_table_stride;
    // An e4m3 cache's dequantisation factors per (batch, kv head), the batch being the sequence's
    // (not its cache entry's): a stored value is the new value (a key rotated first) divided by its
    // factor in float32, rounded to the nearest even e4m3 value, finite values saturating at +-448.
    // Read only where the cache is e4m3.
    Descale k_descale;
    Descale v_descale;

    // Queries (batch, q_rows, heads_q, d_head) rotated into q_out (contiguous); q_rows 0: none. With
    // q_per_token query i is at position seqlens[b] + i, else every query at seqlens[b].
    const void *q;
    TensorStrides q_strides;
    void *q_out;
    int q_rows;
    int heads_q;
    bool q_per_token;

    int d_head;
    // Rotary embedding of the first rotary_dim columns (0: none) at a row's position, clamped to
    // the table's rotary_rows: cos and sin are (rotary_rows, rotary_dim / 2), contiguous, float32
    // or the tensors' dtype (rotary_float). interleaved pairs columns (2j, 2j + 1), else (j,
    // j + rotary_dim / 2).
    const void *cos;
    const void *sin;
    bool rotary_float;
    int rotary_rows;
    int rotary_dim;
    bool interleaved;
};

// dtype: q's and the new rows' (16-bit); cache_dtype: the caches', dtype or E4M3.
void append_to_cache(DType dtype, DType cache_dtype, const AppendParams &params, cudaStream_t stream);

} // namespace flash
