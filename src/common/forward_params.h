// The parameter block of one forward call: built once by the binding, read by every kernel family.
// Plain C++ (no torch, no CUDA headers), so kernels, launchers and the binding share it.
#pragma once

#include <cstdint>

namespace flash {

// Element strides of one (batch, seq, heads, d_head) tensor; the last dimension is contiguous.
struct TensorStrides {
    int64_t batch;
    int64_t seq;
    int64_t head;
};

// Which (query, key) pairs a call lets attend, beyond the lengths, and what is applied to the
// scores (FlashAttention-2's semantics: the mask is aligned to the bottom-right corner of the score
// matrix, so query i's diagonal is key i + seqlen_k - seqlen_q).
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

struct ForwardParams {
    const void *q; // (batch, seqlen_q, heads_q, d_head)
    const void *k; // (batch, seqlen_k, heads_kv, d_head)
    const void *v; // (batch, seqlen_k, heads_kv, d_head)
    void *o;       // (batch, seqlen_q, heads_q, d_head)
    float *lse;    // null, or (batch, heads_q, seqlen_q) contiguous: the rows' natural-log sum of exp
    TensorStrides q_strides;
    TensorStrides k_strides;
    TensorStrides v_strides;
    TensorStrides o_strides;
    int batch;
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int heads_kv; // divides heads_q: query head h reads key/value head h / (heads_q / heads_kv)
    int d_head;
    float softmax_scale; // multiplies Q K^T before the softmax
    MaskParams mask;
    // A zeroed counter in device memory for a kernel that hands out its work tiles as blocks ask for
    // them (ForwardLauncher::needs_work_counter); null for the others.
    int *work_counter;
};

} // namespace flash
