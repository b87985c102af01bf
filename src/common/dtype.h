// Element types of q, k, v and o, shared by every kernel family and the binding.
#pragma once

namespace flash {

// The values are torch's ScalarType codes, so the Python helpers and the binding agree on them
// without importing torch. E4M3 (torch.float8_e4m3fn) is the type of the Hopper family's FP8 q, k
// and v, and of an FP8 cache's k and v beside 16-bit q (the SM80 family's decoding configurations):
// they come with dequantisation factors (ForwardParams::descales), and the output is 16-bit
// (ForwardParams::o_dtype).
enum class DType : int { FP16 = 5, BF16 = 15, E4M3 = 24 };

// Bytes of one element of either 16-bit type: what every kernel of 16-bit inputs and outputs uses.
constexpr int ELEMENT_BYTES = 2;

// Bytes of one element of any type.
constexpr int element_bytes(DType dtype) { return dtype == DType::E4M3 ? 1 : 2; }

} // namespace flash
