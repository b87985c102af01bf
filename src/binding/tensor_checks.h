// The rules a call's tensors must satisfy before anything is launched: each tensor on its own, and
// k, v and o against q.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/dtypes.h"
#include "common/common.h"
#include "common/forward_params.h"

namespace flash::binding {

// Elements of t's dtype in the kernels' copy width (16 bytes): 8 of a 16-bit type, 16 of e4m3.
inline int64_t elements_per_copy(const at::Tensor &t) { return COPY_BYTES / static_cast<int64_t>(t.element_size()); }

// q, k, v and o: a (batch, seq, heads, d_head) tensor of an input type (float16, bfloat16 or
// float8_e4m3fn; o's dtype is check_output's) whose last dimension is contiguous and whose other
// strides and data pointer are 16-byte aligned (the kernels' copy width). `on_device`: whether it
// must be a CUDA tensor (choose_config also takes tensors on the meta device).
inline void check_tensor(const at::Tensor &t, const char *name, bool on_device = true) {
    if (on_device && !t.is_cuda())
        throw py::value_error(std::string(name) + ": expected a CUDA tensor, got a tensor on " + t.device().str());
    if (!is_input_dtype(t.scalar_type()))
        throw py::type_error(std::string(name) + ": dtype must be float16, bfloat16 or float8_e4m3fn, got " + dtype_str(t));
    if (t.dim() != 4)
        throw py::value_error(std::string(name) + ": expected 4 dimensions (batch, seq, heads, d_head), got " +
                              std::to_string(t.dim()));
    if (!on_device)
        return;
    if (t.size(3) > 1 && t.stride(3) != 1)
        throw py::value_error(std::string(name) + ": the last dimension (d_head) must be contiguous (stride 1), got stride " +
                              std::to_string(t.stride(3)));
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % COPY_BYTES != 0)
        throw py::value_error(std::string(name) + ": the data pointer must be 16-byte aligned");
    const int64_t multiple = elements_per_copy(t);
    for (int dim = 0; dim < 3; ++dim)
        if (t.size(dim) > 1 && t.stride(dim) % multiple != 0)
            throw py::value_error(std::string(name) + ": the batch, seq and head strides must be multiples of " +
                                  std::to_string(multiple) + " elements (16 bytes of " + torch_name(t.scalar_type()) +
                                  "), got strides " + std::to_string(t.stride(0)) + ", " + std::to_string(t.stride(1)) +
                                  ", " + std::to_string(t.stride(2)));
}

// o's dtype: the call's output dtype (fp8.h's output_dtype: q's, or for float8_e4m3fn inputs the
// 16-bit type out_dtype names).
inline void check_output_dtype(const at::Tensor &o, at::ScalarType o_dtype, const at::Tensor &q) {
    if (o.scalar_type() == o_dtype)
        return;
    const std::string rule = is_e4m3(q) ? "float8_e4m3fn inputs write the 16-bit type out_dtype names, bfloat16 by default"
                                        : "o has q's dtype";
    throw py::type_error("o: dtype " + dtype_str(o) + " is not the output's " + torch_name(o_dtype) + " (" + rule + ")");
}

// The rule tying one tensor to q: its device (k's and v's dtypes: fp8.h's check_kv_dtypes).
inline void check_same_device(const at::Tensor &t, const char *name, const at::Tensor &q) {
    if (t.device() != q.device())
        throw py::value_error(std::string(name) + ": is on " + t.device().str() + " but q is on " + q.device().str() +
                              "; all tensors must be on one device");
}

// k and v: (batch, seqlen_k, heads_kv, d_head) with q's batch (unless an index picks each
// sequence's entry: kv_batches_indexed) and d_head, heads_kv dividing heads_q; v of k's shape. The
// lengths and counts within what the kernels index.
inline void check_shapes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool kv_batches_indexed) {
    if ((!kv_batches_indexed && k.size(0) != q.size(0)) || k.size(3) != q.size(3))
        throw py::value_error("k: shape " + shape_str(k) + " must be (batch, seqlen_k, heads_kv, d_head) with q's batch and "
                              "d_head, q being " + shape_str(q));
    if (k.size(2) == 0 || q.size(2) % k.size(2) != 0)
        throw py::value_error("k: heads_q (" + std::to_string(q.size(2)) + ") must be a multiple of heads_kv (" +
                              std::to_string(k.size(2)) + ")");
    if (v.sizes() != k.sizes())
        throw py::value_error("v: shape " + shape_str(v) + " differs from k's " + shape_str(k) +
                              "; k and v must have the same (batch, seqlen_k, heads_kv, d_head) shape");
    if (k.size(0) > std::numeric_limits<int>::max())
        throw py::value_error("k: at most " + std::to_string(std::numeric_limits<int>::max()) + " batch entries or pages");
    if (q.size(0) > 65535 || q.size(2) > 65535)
        throw py::value_error("q: batch and heads must each be at most 65535 (CUDA grid limits), got batch " +
                              std::to_string(q.size(0)) + ", heads " + std::to_string(q.size(2)));
    for (const auto &[t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}})
        if (t->size(1) > MAX_SEQLEN)
            throw py::value_error(std::string(name) + ": sequence length " + std::to_string(t->size(1)) + " exceeds " +
                                  std::to_string(MAX_SEQLEN));
}

// o (its dtype checked by check_output_dtype): q's shape, and no memory shared with an input.
inline void check_output(const at::Tensor &o, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
    check_tensor(o, "o");
    check_same_device(o, "o", q);
    if (o.sizes() != q.sizes())
        throw py::value_error("o: shape " + shape_str(o) + " differs from q's " + shape_str(q) +
                              "; o must have q's (batch, seqlen_q, heads_q, d_head) shape");
    // Byte range [first, last) that a strided tensor can touch.
    const auto extent = [](const at::Tensor &t) {
        const uintptr_t first = reinterpret_cast<uintptr_t>(t.data_ptr());
        int64_t last_offset = 0;
        for (int dim = 0; dim < t.dim(); ++dim)
            last_offset += (t.size(dim) - 1) * t.stride(dim);
        return std::pair{first, first + (last_offset + 1) * t.element_size()};
    };
    for (const auto &[input, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
        if (o.numel() == 0 || input->numel() == 0)
            continue;
        const auto [o_first, o_last] = extent(o);
        const auto [in_first, in_last] = extent(*input);
        if (o_first < in_last && in_first < o_last)
            throw py::value_error(std::string("o: overlaps ") + name +
                                  " in memory; the output must not share memory with an input");
    }
}

} // namespace flash::binding
