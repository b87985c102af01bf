// flash_attn_with_kvcache's writes before the attention (kvcache/append.h): its tensors checked,
// decoded into AppendParams and launched on the current stream. What the Python function and the
// torch operator flash_attention::append_to_cache both run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/dtypes.h"
#include "binding/fp8.h"
#include "binding/sequences.h"
#include "common/forward_params.h"
#include "kvcache/append.h"

namespace flash::binding {

// A (batch, seq, heads, d_head) tensor of q's dtype and device whose last dimension is contiguous.
inline void check_rows_tensor(const at::Tensor &t, const char *name, const at::Tensor &q) {
    if (t.dim() != 4)
        throw py::value_error(std::string(name) + ": expected 4 dimensions (batch, seq, heads, d_head), got " + shape_str(t));
    if (t.scalar_type() != q.scalar_type() || t.device() != q.device())
        throw py::value_error(std::string(name) + ": " + dtype_str(t) + " on " + t.device().str() + ", q is " + dtype_str(q) +
                              " on " + q.device().str());
    if (t.size(3) > 1 && t.stride(3) != 1)
        throw py::value_error(std::string(name) + ": the last dimension (d_head) must be contiguous");
}

inline TensorStrides row_strides(const at::Tensor &t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// Appends k and v (where given) to the caches at each sequence's `seqlens` and rotates them and q by
// rotary_cos and rotary_sin (where given). Returns the rotated q (contiguous, a new tensor), or an
// empty tensor without rotary.
inline at::Tensor append_to_cache(const at::Tensor &q, const at::Tensor &k_cache, const at::Tensor &v_cache,
                                  const std::optional<at::Tensor> &k, const std::optional<at::Tensor> &v,
                                  const at::Tensor &seqlens, const std::optional<at::Tensor> &batch_idx,
                                  const std::optional<at::Tensor> &block_table, const std::optional<at::Tensor> &rotary_cos,
                                  const std::optional<at::Tensor> &rotary_sin, bool interleaved, bool q_per_token) {
    check_e4m3_runs(q, "flash_attn_with_kvcache's append to the cache");
    if (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16)
        throw py::type_error("q: dtype must be float16 or bfloat16, got " + dtype_str(q));
    check_rows_tensor(q, "q", q);
    check_rows_tensor(k_cache, "k_cache", q);
    check_rows_tensor(v_cache, "v_cache", q);
    if (v_cache.sizes() != k_cache.sizes())
        throw py::value_error("v_cache: shape " + shape_str(v_cache) + " differs from k_cache's " + shape_str(k_cache));
    const int64_t batch = q.size(0), d_head = q.size(3);
    if (k_cache.size(3) != d_head)
        throw py::value_error("k_cache: d_head " + std::to_string(k_cache.size(3)) + " differs from q's " + std::to_string(d_head));
    check_sequence_tensor(seqlens, "cache_seqlens", batch, q, true);
    check_sequence_tensor(batch_idx, "cache_batch_idx", batch, q, true);
    if (block_table)
        check_block_table(*block_table, q, k_cache, batch, true);
    if (k.has_value() != v.has_value())
        throw py::value_error("k, v: give both new keys and new values, or neither");
    if (rotary_cos.has_value() != rotary_sin.has_value())
        throw py::value_error("rotary_cos, rotary_sin: give both, or neither");

    AppendParams params{};
    params.batch = static_cast<int>(batch);
    params.seqlens = seqlens.data_ptr<int>();
    params.d_head = static_cast<int>(d_head);
    params.heads_kv = static_cast<int>(k_cache.size(2));
    params.entries = static_cast<int>(k_cache.size(0));
    params.entry_rows = static_cast<int>(k_cache.size(1));
    params.capacity = static_cast<int>(block_table ? block_table->size(1) * k_cache.size(1) : k_cache.size(1));
    params.k_cache = k_cache.data_ptr();
    params.v_cache = v_cache.data_ptr();
    params.k_cache_strides = row_strides(k_cache);
    params.v_cache_strides = row_strides(v_cache);
    params.batch_idx = batch_idx ? batch_idx->data_ptr<int>() : nullptr;
    params.block_table = block_table ? block_table->data_ptr<int>() : nullptr;
    params.block_table_stride = block_table ? block_table->stride(0) : 0;
    if (k) {
        check_rows_tensor(*k, "k", q);
        check_rows_tensor(*v, "v", q);
        if (k->size(0) != batch || k->size(2) != params.heads_kv || k->size(3) != d_head || v->sizes() != k->sizes())
            throw py::value_error("k, v: expected (batch, seqlen_new, heads_kv, d) = (" + std::to_string(batch) + ", n, " +
                                  std::to_string(params.heads_kv) + ", " + std::to_string(d_head) + ") each, got " +
                                  shape_str(*k) + " and " + shape_str(*v));
        if (k->size(1) > 0 && (params.entries < 1 || params.capacity < 1))
            throw py::value_error("k_cache: has no rows to append the new keys to");
        params.k_new = k->data_ptr();
        params.v_new = v->data_ptr();
        params.k_new_strides = row_strides(*k);
        params.v_new_strides = row_strides(*v);
        params.new_rows = static_cast<int>(k->size(1));
    }
    at::Tensor q_out = at::empty({0}, q.options());
    if (rotary_cos) {
        const at::Tensor &cos = *rotary_cos, &sin = *rotary_sin;
        if (cos.dim() != 2 || sin.sizes() != cos.sizes() || cos.size(0) < 1)
            throw py::value_error("rotary_cos, rotary_sin: expected two (seqlen_ro, rotary_dim / 2) tensors, got " +
                                  shape_str(cos) + " and " + shape_str(sin));
        if (2 * cos.size(1) > d_head)
            throw py::value_error("rotary_cos: rotary_dim " + std::to_string(2 * cos.size(1)) + " is more than d_head " +
                                  std::to_string(d_head));
        const bool is_float = cos.scalar_type() == at::kFloat;
        if ((!is_float && cos.scalar_type() != q.scalar_type()) || sin.scalar_type() != cos.scalar_type() ||
            cos.device() != q.device() || sin.device() != q.device() || !cos.is_contiguous() || !sin.is_contiguous())
            throw py::value_error("rotary_cos, rotary_sin: expected contiguous float32 or " + dtype_str(q) + " tensors on " +
                                  q.device().str() + ", got " + dtype_str(cos) + " and " + dtype_str(sin));
        params.cos = cos.data_ptr();
        params.sin = sin.data_ptr();
        params.rotary_float = is_float;
        params.rotary_rows = static_cast<int>(cos.size(0));
        params.rotary_dim = static_cast<int>(2 * cos.size(1));
        params.interleaved = interleaved;
        q_out = at::empty(q.sizes(), q.options());
        params.q = q.data_ptr();
        params.q_strides = row_strides(q);
        params.q_out = q_out.data_ptr();
        params.q_rows = static_cast<int>(q.size(1));
        params.heads_q = static_cast<int>(q.size(2));
        params.q_per_token = q_per_token;
    }
    // Last: every rule above is checked from shapes alone.
    if (!q.is_cuda())
        throw py::value_error("q: expected a CUDA tensor, got a tensor on " + q.device().str());
    const c10::cuda::CUDAGuard guard(q.device());
    flash::append_to_cache(dtype_of(q), params,
                           at::cuda::getCurrentCUDAStream(q.device().index()).stream());
    return q_out;
}

} // namespace flash::binding
