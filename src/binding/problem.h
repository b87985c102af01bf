// The problem side of a call: the lengths and counts, the softmax scale, the mask and the score
// modifications, decoded once into the parameter block, with the mask kind they need. Every rule
// that depends on the problem and not on a configuration is here.
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/dtypes.h"
#include "binding/sequences.h"
#include "common/forward_params.h"
#include "common/problem_variant.h"

namespace flash::binding {

// The problem-side arguments of one call, their types and their own values checked.
struct ProblemArguments {
    bool causal;
    std::optional<float> softmax_scale; // none: 1 / sqrt(d_head)
    Window window;
    float softcap;
    std::optional<at::Tensor> alibi_slopes;
};

// The arguments with their own values checked (types were checked where they were decoded).
inline ProblemArguments problem_arguments(bool causal, std::optional<double> softmax_scale, Window window, double softcap,
                                          std::optional<at::Tensor> alibi_slopes) {
    ProblemArguments args{causal, std::nullopt, window, finite_value(softcap, "softcap"), std::move(alibi_slopes)};
    if (softmax_scale) {
        args.softmax_scale = finite_value(*softmax_scale, "softmax_scale");
        if (!(*args.softmax_scale > 0.0f))
            throw py::value_error("softmax_scale: must be a finite positive number, got " + std::to_string(*args.softmax_scale));
    }
    if (args.softcap < 0.0f)
        throw py::value_error("softcap: must be >= 0 (0 turns it off), got " + std::to_string(args.softcap));
    return args;
}

// The same, decoded from Python objects, before any tensor is looked at: a bad argument is named
// whatever the tensors are.
inline ProblemArguments problem_arguments(bool causal, py::handle softmax_scale, py::handle window_size, py::handle softcap,
                                          py::handle alibi_slopes) {
    const Window window = window_argument(window_size);
    const double cap = number_argument(softcap, "softcap");
    const std::optional<double> scale =
        softmax_scale.is_none() ? std::nullopt : std::optional(number_argument(softmax_scale, "softmax_scale"));
    const std::optional<at::Tensor> slopes =
        alibi_slopes.is_none() ? std::nullopt : std::optional(tensor_argument(alibi_slopes, "alibi_slopes"));
    return problem_arguments(causal, scale, window, cap, slopes);
}

// What a call asks for beyond its tensors: the mask kind, whether the scores are modified, whether
// each sequence has lengths of its own, and whether k and v are an FP8 cache (e4m3 beside 16-bit
// q); the rest is in the parameter block.
struct Problem {
    MaskKind mask;
    bool score_mods;
    bool varlen; // paged caches (PagedKV) among them
    bool kv_e4m3;
};

// The mask kind of effective window sides (set_window's).
inline MaskKind mask_kind(const MaskParams &mask) {
    const bool left_bounded = mask.window_left != UNBOUNDED_WINDOW;
    const bool right_bounded = mask.window_right != UNBOUNDED_WINDOW;
    if (!left_bounded && !right_bounded)
        return MaskKind::NONE;
    return !left_bounded && mask.window_right == 0 ? MaskKind::CAUSAL : MaskKind::LOCAL;
}

// The effective window sides of a mask: causal sets the right side to 0; a side that reaches past
// every key (left: even the last query's window reaches key 0; right: even the first query's reaches
// the last key) is unbounded, so the mask kind is the cheapest that computes the same result. The
// window's sides are checked even where causal overrides one.
inline void set_window(MaskParams &mask, bool causal, Window window, int seqlen_q, int seqlen_k) {
    const int right = causal ? 0 : window.right;
    mask.window_left = window.left >= 0 && window.left < seqlen_k - 1 ? window.left : UNBOUNDED_WINDOW;
    mask.window_right = right >= 0 && right < seqlen_q - 1 ? right : UNBOUNDED_WINDOW;
}

// Fills params' lengths, counts, sequences, softmax scale and mask from q and k's shapes (in the
// batch layout) and the arguments.
inline Problem decode_problem(const ProblemArguments &args, const SequenceArguments &sequences, const at::Tensor &q,
                              const at::Tensor &k, bool on_device, ForwardParams &params) {
    params.batch = static_cast<int>(q.size(0));
    params.seqlen_q = static_cast<int>(q.size(1));
    params.seqlen_k = static_cast<int>(k.size(1));
    params.heads_q = static_cast<int>(q.size(2));
    params.heads_kv = static_cast<int>(k.size(2));
    params.d_head = static_cast<int>(q.size(3));
    decode_sequences(sequences, q, k, on_device, params);

    params.softmax_scale = args.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(params.d_head)));
    params.mask.softcap = args.softcap;
    set_window(params.mask, args.causal, args.window, params.seqlen_q, params.seqlen_k);

    params.mask.alibi_slopes = nullptr;
    params.mask.alibi_batch_stride = 0;
    if (args.alibi_slopes) {
        const at::Tensor &slopes = *args.alibi_slopes;
        if (slopes.scalar_type() != at::kFloat)
            throw py::type_error("alibi_slopes: dtype must be float32, got " + dtype_str(slopes));
        if (q.is_cuda() && slopes.device() != q.device())
            throw py::value_error("alibi_slopes: is on " + slopes.device().str() + " but q is on " + q.device().str());
        const bool per_head = slopes.dim() == 1 && slopes.size(0) == params.heads_q;
        const bool per_batch = slopes.dim() == 2 && slopes.size(0) == params.batch && slopes.size(1) == params.heads_q;
        if (!per_head && !per_batch)
            throw py::value_error("alibi_slopes: shape " + shape_str(slopes) + " must be (heads_q,) = (" +
                                  std::to_string(params.heads_q) + ",) or (batch, heads_q) = (" +
                                  std::to_string(params.batch) + ", " + std::to_string(params.heads_q) + ")");
        if (slopes.size(-1) > 1 && slopes.stride(-1) != 1)
            throw py::value_error("alibi_slopes: the heads dimension must be contiguous (stride 1)");
        // Only a launch reads the slopes (choose_config may pass tensors without data, on the meta device).
        params.mask.alibi_slopes = q.is_cuda() ? slopes.data_ptr<float>() : nullptr;
        params.mask.alibi_batch_stride = per_batch ? slopes.stride(0) : 0;
    }
    return Problem{mask_kind(params.mask), args.softcap > 0.0f || args.alibi_slopes.has_value(), sequences.any(),
                   !is_e4m3(q) && is_e4m3(k)};
}

} // namespace flash::binding
