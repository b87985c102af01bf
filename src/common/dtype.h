// Element types of q, k, v and o, shared by every kernel family and the binding.
#pragma once

namespace flash {

// The values are torch's ScalarType codes, so the Python helpers and the binding agree on them
// without importing torch.
enum class DType : int { FP16 = 5, BF16 = 15 };

// Bytes of one element of either 16-bit type.
constexpr int ELEMENT_BYTES = 2;

} // namespace flash
