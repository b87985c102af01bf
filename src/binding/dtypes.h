// The element types as the binding meets them: a tensor's torch dtype and the kernels' DType, which
// share their codes (common/dtype.h), and their names in messages.
#pragma once

#include <string>

#include <torch/extension.h>

#include "common/dtype.h"

namespace flash::binding {

static_assert(static_cast<int>(at::kHalf) == static_cast<int>(DType::FP16) &&
                  static_cast<int>(at::kBFloat16) == static_cast<int>(DType::BF16) &&
                  static_cast<int>(at::kFloat8_e4m3fn) == static_cast<int>(DType::E4M3),
              "DType's values are torch's ScalarType codes");

inline bool is_input_dtype(at::ScalarType type) {
    return type == at::kHalf || type == at::kBFloat16 || type == at::kFloat8_e4m3fn;
}

inline bool is_e4m3(const at::Tensor &t) { return t.scalar_type() == at::kFloat8_e4m3fn; }

// Whether k and v have dtypes a call of q's runs: q's, or an FP8 cache's e4m3 beside 16-bit q.
inline bool kv_dtypes_agree(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
    const bool fp8_cache = !is_e4m3(q) && is_e4m3(k) && is_e4m3(v);
    return fp8_cache || (k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type());
}

// The DType of an input type (is_input_dtype), or of a tensor of one.
inline DType dtype_of(at::ScalarType type) { return static_cast<DType>(type); }
inline DType dtype_of(const at::Tensor &t) { return dtype_of(t.scalar_type()); }

inline at::ScalarType scalar_type_of(DType dtype) { return static_cast<at::ScalarType>(dtype); }

// torch's name of a floating-point type, as Python spells it (float16, float8_e4m3fn, float32, ...);
// c10's for any other.
inline std::string torch_name(at::ScalarType type) {
    switch (type) {
    case at::kHalf:
        return "float16";
    case at::kBFloat16:
        return "bfloat16";
    case at::kFloat8_e4m3fn:
        return "float8_e4m3fn";
    case at::kFloat8_e5m2:
        return "float8_e5m2";
    case at::kFloat:
        return "float32";
    case at::kDouble:
        return "float64";
    default:
        return c10::toString(type);
    }
}

inline std::string torch_name(DType dtype) { return torch_name(scalar_type_of(dtype)); }

} // namespace flash::binding
