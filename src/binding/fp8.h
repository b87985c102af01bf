// FP8 (e4m3) inputs and caches: the dtypes q, k and v may have together (one input type, or an FP8
// cache: e4m3 k and v beside 16-bit q), the dtype of the output a call writes (every call's: q's
// for 16-bit q, the 16-bit type out_dtype names for e4m3 q, bfloat16 by default as in
// FlashAttention-3), the inputs' dequantisation factors (FlashAttention-3's q_descale, k_descale
// and v_descale: float32, one per (batch, kv head), any strides). Only the Hopper family has configurations of e4m3 q, dense and
// varlen (per-sequence lengths, paged caches), so the decoding configuration (of the SM80 family),
// the split over the keys and grouped-query packing (binding/grouped_query_packing.h) never take
// such a call: it runs whole on a Hopper kernel as it comes. An FP8 cache runs on the SM80
// family's decoding configurations, which read its e4m3 tiles and widen them in registers (a problem
// variant of their own, ProblemVariant::kv_e4m3), packed and split as a 16-bit cache is.
#pragma once

#include <optional>
#include <string>

#include <torch/csrc/Dtype.h>
#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/dtypes.h"
#include "binding/tensor_checks.h"
#include "common/forward_params.h"

namespace flash::binding {

struct Fp8Arguments {
    std::optional<at::Tensor> q_descale;
    std::optional<at::Tensor> k_descale;
    std::optional<at::Tensor> v_descale;
    std::optional<at::ScalarType> out_dtype; // none: the default output's dtype
};

// Decoded from Python objects, each type checked (tensors, and out_dtype a torch.dtype).
inline Fp8Arguments fp8_arguments(py::handle q_descale, py::handle k_descale, py::handle v_descale, py::handle out_dtype) {
    Fp8Arguments args{optional_tensor(q_descale, "q_descale"), optional_tensor(k_descale, "k_descale"),
                      optional_tensor(v_descale, "v_descale"), std::nullopt};
    if (!out_dtype.is_none()) {
        if (!THPDtype_Check(out_dtype.ptr()))
            throw py::type_error("out_dtype: expected a torch.dtype (torch.bfloat16 or torch.float16), got " +
                                 type_name(out_dtype));
        args.out_dtype = reinterpret_cast<THPDtype *>(out_dtype.ptr())->scalar_type;
    }
    return args;
}

// The dtype of o for inputs of q's (checked) dtype; ValueError naming out_dtype where it asks for
// another (flash_helpers.dtypes.output_dtype states the same rule for the operators' fake kernels).
inline at::ScalarType output_dtype(const at::Tensor &q, std::optional<at::ScalarType> out_dtype) {
    if (is_e4m3(q)) {
        if (!out_dtype)
            return at::kBFloat16;
        if (*out_dtype != at::kHalf && *out_dtype != at::kBFloat16)
            throw py::value_error("out_dtype: must be float16 or bfloat16 for float8_e4m3fn inputs, got " +
                                  torch_name(*out_dtype));
        return *out_dtype;
    }
    if (out_dtype && *out_dtype != q.scalar_type())
        throw py::value_error("out_dtype: chooses the output's dtype of float8_e4m3fn inputs only; " +
                              torch_name(q.scalar_type()) + " inputs give a " + torch_name(q.scalar_type()) +
                              " output, got " + torch_name(*out_dtype));
    return q.scalar_type();
}

// k's and v's dtypes against q's (kv_dtypes_agree), and their devices; TypeError naming the one
// that breaks the rule.
inline void check_kv_dtypes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
    check_same_device(k, "k", q);
    check_same_device(v, "v", q);
    if (kv_dtypes_agree(q, k, v))
        return;
    if (!is_e4m3(q) && is_e4m3(k) != is_e4m3(v)) {
        const at::Tensor &other = is_e4m3(k) ? v : k;
        throw py::type_error(std::string(is_e4m3(k) ? "v" : "k") + ": dtype " + torch_name(other.scalar_type()) +
                             "; an FP8 cache has float8_e4m3fn keys and values both (beside float16 or bfloat16 q)");
    }
    const at::Tensor &odd = k.scalar_type() != q.scalar_type() ? k : v;
    const std::string rule = is_e4m3(q) ? "; float8_e4m3fn q takes float8_e4m3fn k and v"
                                        : "; k and v have q's dtype, or are both float8_e4m3fn (an FP8 cache)";
    throw py::type_error(std::string(&odd == &k ? "k" : "v") + ": dtype " + dtype_str(odd) + " differs from q's " +
                         dtype_str(q) + rule);
}

// One input's factors (name: q_descale, k_descale or v_descale, of `input`, called input_name in
// messages), checked against q (on its device) and the problem's batch and heads_kv.
inline Descale descale_of(const std::optional<at::Tensor> &given, const char *name, const at::Tensor &input,
                          const char *input_name, const at::Tensor &q, int64_t batch, int64_t heads_kv) {
    if (!given)
        return Descale{nullptr, 0, 0};
    const at::Tensor &t = *given;
    if (!is_e4m3(input))
        throw py::value_error(std::string(name) + ": descales apply to float8_e4m3fn inputs only; " + input_name + " is " +
                              torch_name(input.scalar_type()));
    if (t.scalar_type() != at::kFloat)
        throw py::type_error(std::string(name) + ": dtype must be float32, got " + dtype_str(t));
    if (t.device() != q.device())
        throw py::value_error(std::string(name) + ": is on " + t.device().str() + " but q is on " + q.device().str());
    if (t.dim() != 2 || t.size(0) != batch || t.size(1) != heads_kv)
        throw py::value_error(std::string(name) + ": shape " + shape_str(t) + " must be (batch, heads_kv) = (" +
                              std::to_string(batch) + ", " + std::to_string(heads_kv) + ")");
    return Descale{t.data_ptr<float>(), t.stride(0), t.stride(1)};
}

// params.descales from the arguments (factors of 1 where none is given).
inline void set_descales(const Fp8Arguments &args, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         ForwardParams &params) {
    const auto of = [&](const std::optional<at::Tensor> &given, const char *name, const at::Tensor &input,
                        const char *input_name) {
        return descale_of(given, name, input, input_name, q, params.batch, params.heads_kv);
    };
    params.descales = Descales{of(args.q_descale, "q_descale", q, "q"), of(args.k_descale, "k_descale", k, "k"),
                               of(args.v_descale, "v_descale", v, "v")};
}

} // namespace flash::binding
