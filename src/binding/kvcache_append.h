// flash_attn_with_kvcache's writes before the attention (kvcache/append.h): its tensors checked,
// decoded into AppendParams and launched on the current stream. What the Python function and the
// torch operator flash_attention::append_to_cache both run. The caches hold q's 16-bit dtype, or
// both float8_e4m3fn with their dequantisation factors k_descale and v_descale (FlashAttention-3's,
// as the attention that reads them takes them).
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
#include "binding/tensor_checks.h"
#include "common/common.h"
#include "common/forward_params.h"
#include "kvcache/append.h"

namespace flash::binding {

// A (batch, seq, heads, d_head) tensor of q's dtype and device whose last dimension is contiguous; a
// cache's dtype may be float8_e4m3fn instead (`cache`).
inline void check_rows_tensor(const at::Tensor &t, const char *name, const at::Tensor &q, bool cache = false) {
    if (t.dim() != 4)
        throw py::value_error(std::string(name) + ": expected 4 dimensions (batch, seq, heads, d_head), got " + shape_str(t));
    if ((t.scalar_type() != q.scalar_type() && !(cache && is_e4m3(t))) || t.device() != q.device())
        throw py::value_error(std::string(name) + ": " + dtype_str(t) + " on " + t.device().str() + ", q is " + dtype_str(q) +
                              " on " + q.device().str() + (cache ? " (a cache holds q's dtype or float8_e4m3fn)" : ""));
    if (t.size(3) > 1 && t.stride(3) != 1)
        throw py::value_error(std::string(name) + ": the last dimension (d_head) must be contiguous");
}

// An e4m3 cache as the attention kernels read it, in 16-byte chunks (16 elements): d_head, the
// strides of the dimensions that have more than one element (as for every input, tensor_checks.h)
// and the data pointer are multiples of a chunk.
inline void check_e4m3_cache_layout(const at::Tensor &cache, const char *name) {
    const int64_t chunk = elements_per_copy(cache);
    const std::string rule = std::string(name) + ": a float8_e4m3fn cache's rows are read in 16-byte chunks, so ";
    if (cache.size(3) % chunk != 0)
        throw py::value_error(rule + "d_head must be a multiple of " + std::to_string(chunk) + ", got " +
                              std::to_string(cache.size(3)));
    for (int dim = 0; dim < 3; ++dim)
        if (cache.size(dim) > 1 && cache.stride(dim) % chunk != 0)
            throw py::value_error(rule + "its batch, seq and head strides must be multiples of " + std::to_string(chunk) +
                                  " elements, got strides " + std::to_string(cache.stride(0)) + ", " +
                                  std::to_string(cache.stride(1)) + ", " + std::to_string(cache.stride(2)));
    if (reinterpret_cast<uintptr_t>(cache.data_ptr()) % COPY_BYTES != 0)
        throw py::value_error(rule + "its data pointer must be 16-byte aligned");
}

inline TensorStrides row_strides(const at::Tensor &t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// Appends k and v (where given) to the caches at each sequence's `seqlens` and rotates them and q by
// rotary_cos and rotary_sin (where given); into e4m3 caches quantised by k_descale and v_descale.
// Returns the rotated q (contiguous, a new tensor), or an empty tensor without rotary.
inline at::Tensor append_to_cache(const at::Tensor &q, const at::Tensor &k_cache, const at::Tensor &v_cache,
                                  const std::optional<at::Tensor> &k, const std::optional<at::Tensor> &v,
                                  const at::Tensor &seqlens, const std::optional<at::Tensor> &batch_idx,
                                  const std::optional<at::Tensor> &block_table, const std::optional<at::Tensor> &rotary_cos,
                                  const std::optional<at::Tensor> &rotary_sin, bool interleaved, bool q_per_token,
                                  const std::optional<at::Tensor> &k_descale, const std::optional<at::Tensor> &v_descale) {
    const bool quantized = is_e4m3(k_cache);
    if (is_e4m3(q) && (quantized || is_e4m3(v_cache)))
        throw py::type_error("q: a float8_e4m3fn cache takes float16 or bfloat16 queries (and new keys and values of "
                             "their dtype, quantised as they are appended), got " + torch_name(q.scalar_type()));
    // (An FP8 cache takes 16-bit q and quantises what is appended.)
    TORCH_CHECK_NOT_IMPLEMENTED(!is_e4m3(q), "q: float8_e4m3fn inputs are not appended to a cache; flash_attn_with_kvcache's "
                                             "append takes float16 or bfloat16 inputs (into a cache of their dtype or of "
                                             "float8_e4m3fn)");
    if (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16)
        throw py::type_error("q: dtype must be float16 or bfloat16, got " + dtype_str(q));
    check_rows_tensor(q, "q", q);
    check_rows_tensor(k_cache, "k_cache", q, true);
    check_rows_tensor(v_cache, "v_cache", q, true);
    if (is_e4m3(v_cache) != quantized)
        throw py::type_error("k_cache, v_cache: both float8_e4m3fn or neither, got " + torch_name(k_cache.scalar_type()) +
                             " and " + torch_name(v_cache.scalar_type()));
    if (v_cache.sizes() != k_cache.sizes())
        throw py::value_error("v_cache: shape " + shape_str(v_cache) + " differs from k_cache's " + shape_str(k_cache));
    const int64_t batch = q.size(0), d_head = q.size(3);
    if (k_cache.size(3) != d_head)
        throw py::value_error("k_cache: d_head " + std::to_string(k_cache.size(3)) + " differs from q's " + std::to_string(d_head));
    if (quantized) {
        check_e4m3_cache_layout(k_cache, "k_cache");
        check_e4m3_cache_layout(v_cache, "v_cache");
    }
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
    params.k_descale = descale_of(k_descale, "k_descale", k_cache, "k_cache", q, batch, k_cache.size(2));
    params.v_descale = descale_of(v_descale, "v_descale", v_cache, "v_cache", q, batch, v_cache.size(2));
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
    flash::append_to_cache(dtype_of(q), dtype_of(k_cache), params,
                           at::cuda::getCurrentCUDAStream(q.device().index()).stream());
    return q_out;
}

} // namespace flash::binding
