// The arguments of a call whose sequences have lengths of their own (FlashAttention's varlen call:
// cu_seqlens and max_seqlen, FlashAttention-3's seqused, and leftpad), their checks, and what they
// make of the tensors' layout and the parameter block's lengths. Only their shapes, dtypes and
// devices are checked here: reading their contents would synchronize with the GPU, so the kernels
// clamp what they read (common/sequence.cuh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include <torch/extension.h>

#include "binding/arguments.h"
#include "common/forward_params.h"

namespace flash::binding {

struct SequenceArguments {
    std::optional<at::Tensor> cu_seqlens_q;
    std::optional<at::Tensor> cu_seqlens_k;
    std::optional<int64_t> max_seqlen_q;
    std::optional<int64_t> max_seqlen_k;
    std::optional<at::Tensor> seqused_q;
    std::optional<at::Tensor> seqused_k;
    std::optional<at::Tensor> leftpad_q;
    std::optional<at::Tensor> leftpad_k;

    // Whether each sequence has lengths of its own (the varlen kernels).
    bool any() const { return packed() || seqused_q || seqused_k || leftpad_q || leftpad_k; }
    // Whether q, k and v are (total, heads, d_head) with cu_seqlens, rather than (batch, seq, heads, d_head).
    bool packed() const { return cu_seqlens_q.has_value(); }
    // Whether some rows of q may belong to no sequence: those are then zeroed in o (+inf in lse).
    bool has_gaps() const { return seqused_q || leftpad_q; }
};

inline std::optional<at::Tensor> optional_tensor(py::handle object, const char *name) {
    return object.is_none() ? std::nullopt : std::optional(tensor_argument(object, name));
}

inline std::optional<int64_t> optional_int(py::handle object, const char *name) {
    if (object.is_none())
        return std::nullopt;
    if (!py::isinstance<py::int_>(object) || py::isinstance<py::bool_>(object))
        throw py::type_error(std::string(name) + ": expected an int, got " + std::string(py::str(py::type::handle_of(object).attr("__name__"))));
    return object.cast<int64_t>();
}

// Decoded from Python objects, each type checked.
inline SequenceArguments sequence_arguments(py::handle cu_seqlens_q, py::handle cu_seqlens_k, py::handle max_seqlen_q,
                                            py::handle max_seqlen_k, py::handle seqused_q, py::handle seqused_k,
                                            py::handle leftpad_q, py::handle leftpad_k) {
    return SequenceArguments{optional_tensor(cu_seqlens_q, "cu_seqlens_q"), optional_tensor(cu_seqlens_k, "cu_seqlens_k"),
                             optional_int(max_seqlen_q, "max_seqlen_q"),    optional_int(max_seqlen_k, "max_seqlen_k"),
                             optional_tensor(seqused_q, "seqused_q"),       optional_tensor(seqused_k, "seqused_k"),
                             optional_tensor(leftpad_q, "leftpad_q"),       optional_tensor(leftpad_k, "leftpad_k")};
}

// The rules among the arguments themselves, before any tensor is looked at.
inline void check_sequence_arguments(const SequenceArguments &s, bool heads_first) {
    if (s.cu_seqlens_q.has_value() != s.cu_seqlens_k.has_value())
        throw py::value_error(std::string(s.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q") +
                              ": cu_seqlens_q and cu_seqlens_k are given together or not at all");
    for (const auto &[max, name] : {std::pair{&s.max_seqlen_q, "max_seqlen_q"}, std::pair{&s.max_seqlen_k, "max_seqlen_k"}}) {
        if (s.packed() && !max->has_value())
            throw py::value_error(std::string(name) + ": is required with cu_seqlens (the longest sequence's length)");
        if (!s.packed() && max->has_value())
            throw py::value_error(std::string(name) + ": is given only with cu_seqlens_q and cu_seqlens_k");
        if (max->has_value() && (**max < 0 || **max > MAX_SEQLEN))
            throw py::value_error(std::string(name) + ": must be in [0, " + std::to_string(MAX_SEQLEN) + "], got " +
                                  std::to_string(**max));
    }
    if (heads_first && s.any())
        throw py::value_error("heads_first: the (batch, heads, seq, d_head) layout takes no cu_seqlens, seqused or leftpad");
}

// q, k and v in the kernels' (batch, seq, heads, d_head) layout: with cu_seqlens, (total, heads,
// d_head) tensors seen as one batch entry.
inline void to_batch_layout(const SequenceArguments &s, at::Tensor &q, at::Tensor &k, at::Tensor &v) {
    if (!s.packed())
        return;
    for (const auto &[t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
        if (t->dim() != 3)
            throw py::value_error(std::string(name) + ": expected 3 dimensions (total, heads, d_head) with cu_seqlens, got " +
                                  std::to_string(t->dim()));
        *t = t->unsqueeze(0);
    }
}

// One int32 array of `length` entries on q's device. `on_device`: whether it must be a CUDA tensor
// (choose_config also takes tensors on the meta device).
inline void check_sequence_tensor(const std::optional<at::Tensor> &t, const char *name, int64_t length, const at::Tensor &q,
                                  bool on_device) {
    if (!t)
        return;
    if (t->scalar_type() != at::kInt)
        throw py::type_error(std::string(name) + ": dtype must be int32, got " + dtype_str(*t));
    if (t->dim() != 1 || t->size(0) != length)
        throw py::value_error(std::string(name) + ": shape " + shape_str(*t) + " must be (" + std::to_string(length) + ",)");
    if (on_device && t->device() != q.device())
        throw py::value_error(std::string(name) + ": is on " + t->device().str() + " but q is on " + q.device().str());
    if (length > 1 && t->stride(0) != 1)
        throw py::value_error(std::string(name) + ": must be contiguous");
}

// The batch and lengths of params (q and k in the batch layout), and where each sequence lies: with
// cu_seqlens the batch is theirs and the lengths the longest sequence's; the rows are the tensors'.
inline void decode_sequences(const SequenceArguments &s, const at::Tensor &q, const at::Tensor &k, bool on_device,
                             ForwardParams &params) {
    params.sequences = SequenceLayout{};
    if (!s.any())
        return;
    if (s.packed()) {
        if (s.cu_seqlens_q->dim() != 1 || s.cu_seqlens_q->size(0) < 1)
            throw py::value_error("cu_seqlens_q: shape " + shape_str(*s.cu_seqlens_q) + " must be (batch + 1,)");
        if (s.cu_seqlens_q->size(0) - 1 > 65535)
            throw py::value_error("cu_seqlens_q: at most 65535 sequences (CUDA grid limits), got " +
                                  std::to_string(s.cu_seqlens_q->size(0) - 1));
        params.batch = static_cast<int>(s.cu_seqlens_q->size(0) - 1);
        // No sequence is longer than its tensor.
        params.seqlen_q = static_cast<int>(std::min<int64_t>(*s.max_seqlen_q, q.size(1)));
        params.seqlen_k = static_cast<int>(std::min<int64_t>(*s.max_seqlen_k, k.size(1)));
    }
    const int64_t batch = params.batch;
    check_sequence_tensor(s.cu_seqlens_q, "cu_seqlens_q", batch + 1, q, on_device);
    check_sequence_tensor(s.cu_seqlens_k, "cu_seqlens_k", batch + 1, q, on_device);
    check_sequence_tensor(s.seqused_q, "seqused_q", batch, q, on_device);
    check_sequence_tensor(s.seqused_k, "seqused_k", batch, q, on_device);
    check_sequence_tensor(s.leftpad_q, "leftpad_q", batch, q, on_device);
    check_sequence_tensor(s.leftpad_k, "leftpad_k", batch, q, on_device);
    if (!on_device)
        return;
    const auto pointer = [](const std::optional<at::Tensor> &t) { return t ? t->data_ptr<int>() : nullptr; };
    params.sequences = SequenceLayout{pointer(s.cu_seqlens_q), pointer(s.cu_seqlens_k), pointer(s.seqused_q),
                                      pointer(s.seqused_k),    pointer(s.leftpad_q),    pointer(s.leftpad_k),
                                      static_cast<int>(q.size(1)), static_cast<int>(k.size(1))};
}

} // namespace flash::binding
