// The arguments of a call whose sequences have lengths of their own (FlashAttention's varlen call:
// cu_seqlens and max_seqlen, FlashAttention-3's seqused, and leftpad) or whose keys and values are
// found through an index (a cache's kv_batch_idx, a paged cache's block_table), their checks, and
// what they make of the tensors' layout and the parameter block's lengths. Only their shapes, dtypes and
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
    std::optional<at::Tensor> kv_batch_idx; // (batch,): the batch entry of k and v each sequence reads
    std::optional<at::Tensor> block_table;  // (batch, pages_per_sequence): k and v are pools of pages

    // Whether each sequence has lengths of its own (the varlen kernels).
    bool any() const { return packed() || seqused_q || seqused_k || leftpad_q || leftpad_k || kv_batch_idx || block_table; }
    // Whether q is (total, heads, d_head) with cu_seqlens, rather than (batch, seq, heads, d_head);
    // so are k and v unless they are paged.
    bool packed() const { return cu_seqlens_q.has_value(); }
    bool paged() const { return block_table.has_value(); }
    // Whether k's batch dimension is its own rather than q's (an index picks each sequence's entry).
    bool kv_batches_indexed() const { return paged() || kv_batch_idx.has_value(); }
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
                                            py::handle leftpad_q, py::handle leftpad_k, py::handle kv_batch_idx,
                                            py::handle block_table) {
    return SequenceArguments{optional_tensor(cu_seqlens_q, "cu_seqlens_q"), optional_tensor(cu_seqlens_k, "cu_seqlens_k"),
                             optional_int(max_seqlen_q, "max_seqlen_q"),    optional_int(max_seqlen_k, "max_seqlen_k"),
                             optional_tensor(seqused_q, "seqused_q"),       optional_tensor(seqused_k, "seqused_k"),
                             optional_tensor(leftpad_q, "leftpad_q"),       optional_tensor(leftpad_k, "leftpad_k"),
                             optional_tensor(kv_batch_idx, "kv_batch_idx"), optional_tensor(block_table, "block_table")};
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
        throw py::value_error("heads_first: the (batch, heads, seq, d_head) layout takes no cu_seqlens, seqused, leftpad, "
                              "kv_batch_idx or block_table");
    if (s.kv_batch_idx && (s.packed() || s.paged()))
        throw py::value_error(std::string("kv_batch_idx: is not given with ") + (s.paged() ? "block_table" : "cu_seqlens") +
                              " (a paged or packed k has no batch entries to pick)");
    if (s.paged() && s.leftpad_k)
        throw py::value_error("leftpad_k: is not given with block_table (a paged sequence's keys start at its first page)");
}

// q, k and v in the kernels' (batch, seq, heads, d_head) layout: with cu_seqlens, (total, heads,
// d_head) tensors seen as one batch entry; a paged k and v are (num_pages, page_size, heads_kv,
// d_head) already.
inline void to_batch_layout(const SequenceArguments &s, at::Tensor &q, at::Tensor &k, at::Tensor &v) {
    if (!s.packed())
        return;
    for (const auto &[t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
        if (t != &q && s.paged())
            continue;
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

// A paged cache's table: int32 (batch, pages_per_sequence) on q's device, rows contiguous; its
// pages of a multiple of PagedKV::ROWS_MULTIPLE rows.
inline void check_block_table(const at::Tensor &table, const at::Tensor &q, const at::Tensor &k, int64_t batch,
                              bool on_device) {
    if (table.scalar_type() != at::kInt)
        throw py::type_error("block_table: dtype must be int32, got " + dtype_str(table));
    if (table.dim() != 2 || table.size(0) != batch || table.size(1) < 1)
        throw py::value_error("block_table: shape " + shape_str(table) + " must be (batch, pages_per_sequence) = (" +
                              std::to_string(batch) + ", n) with n >= 1");
    if (on_device && table.device() != q.device())
        throw py::value_error("block_table: is on " + table.device().str() + " but q is on " + q.device().str());
    if (table.size(1) > 1 && table.stride(1) != 1)
        throw py::value_error("block_table: each row must be contiguous");
    if (k.size(0) < 1 || k.size(1) < 1 || k.size(1) % PagedKV::ROWS_MULTIPLE != 0)
        throw py::value_error("k: a paged cache is (num_pages, page_size, heads_kv, d_head) with at least one page and "
                              "page_size a multiple of " + std::to_string(PagedKV::ROWS_MULTIPLE) + ", got " +
                              shape_str(k));
    if (table.size(1) * k.size(1) > MAX_SEQLEN)
        throw py::value_error("block_table: pages_per_sequence * page_size exceeds " + std::to_string(MAX_SEQLEN));
}

// The batch and lengths of params (q and k in the batch layout), and where each sequence lies: with
// cu_seqlens the batch is theirs and the lengths the longest sequence's; the rows are the tensors'
// (a paged sequence's, what its pages hold).
inline void decode_sequences(const SequenceArguments &s, const at::Tensor &q, const at::Tensor &k, bool on_device,
                             ForwardParams &params) {
    params.sequences = SequenceLayout{};
    if (!s.any())
        return;
    // The keys a sequence can have: a paged one's pages hold pages_per_sequence * page_size.
    const int64_t rows_k = s.paged() ? s.block_table->size(-1) * k.size(1) : k.size(1);
    if (s.packed()) {
        if (s.cu_seqlens_q->dim() != 1 || s.cu_seqlens_q->size(0) < 1)
            throw py::value_error("cu_seqlens_q: shape " + shape_str(*s.cu_seqlens_q) + " must be (batch + 1,)");
        if (s.cu_seqlens_q->size(0) - 1 > 65535)
            throw py::value_error("cu_seqlens_q: at most 65535 sequences (CUDA grid limits), got " +
                                  std::to_string(s.cu_seqlens_q->size(0) - 1));
        params.batch = static_cast<int>(s.cu_seqlens_q->size(0) - 1);
        // No sequence is longer than its tensor.
        params.seqlen_q = static_cast<int>(std::min<int64_t>(*s.max_seqlen_q, q.size(1)));
        params.seqlen_k = static_cast<int>(std::min<int64_t>(*s.max_seqlen_k, rows_k));
    } else if (s.paged()) {
        params.seqlen_k = static_cast<int>(rows_k);
    }
    const int64_t batch = params.batch;
    check_sequence_tensor(s.cu_seqlens_q, "cu_seqlens_q", batch + 1, q, on_device);
    check_sequence_tensor(s.cu_seqlens_k, "cu_seqlens_k", batch + 1, q, on_device);
    check_sequence_tensor(s.seqused_q, "seqused_q", batch, q, on_device);
    check_sequence_tensor(s.seqused_k, "seqused_k", batch, q, on_device);
    check_sequence_tensor(s.leftpad_q, "leftpad_q", batch, q, on_device);
    check_sequence_tensor(s.leftpad_k, "leftpad_k", batch, q, on_device);
    check_sequence_tensor(s.kv_batch_idx, "kv_batch_idx", batch, q, on_device);
    if (s.kv_batch_idx && k.size(0) < 1)
        throw py::value_error("k: kv_batch_idx picks entries of k's batch dimension, which has none");
    if (s.paged())
        check_block_table(*s.block_table, q, k, batch, on_device);
    if (!on_device)
        return;
    const auto pointer = [](const std::optional<at::Tensor> &t) { return t ? t->data_ptr<int>() : nullptr; };
    SequenceLayout &layout = params.sequences;
    layout.cu_seqlens_q = pointer(s.cu_seqlens_q);
    layout.cu_seqlens_k = pointer(s.cu_seqlens_k);
    layout.seqused_q = pointer(s.seqused_q);
    layout.seqused_k = pointer(s.seqused_k);
    layout.leftpad_q = pointer(s.leftpad_q);
    layout.leftpad_k = pointer(s.leftpad_k);
    layout.kv_batch_idx = pointer(s.kv_batch_idx);
    layout.rows_q = static_cast<int>(q.size(1));
    layout.rows_k = static_cast<int>(rows_k);
    layout.kv_batches = static_cast<int>(k.size(0));
    if (s.paged())
        layout.paged = PagedKV{pointer(s.block_table), s.block_table->stride(0), static_cast<int>(s.block_table->size(1)),
                               static_cast<int>(k.size(1)), static_cast<int>(k.size(0))};
}

} // namespace flash::binding
