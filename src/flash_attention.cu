// The Python binding: validates the arguments, builds the call's parameter block, looks the kernel
// up in the registry by (family configuration, problem variant) and has its launcher run it on the
// current torch stream. It holds no kernel code and no launch geometry: those are the families'.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "common/common.h"
#include "common/cuda_utils.cuh"
#include "common/forward_params.h"
#include "common/python_fields.h"
#include "generated/kernel_registry.h"
#include "sm80/binding.h"
#include "sm90/binding.h"

namespace py = pybind11;

namespace flash {
namespace {

// Every kernel family of this build. A new family adds its binding header above and its Family here.
using Families = std::tuple<sm80::Family, sm90::Family>;

// Calls visit(Family{}) for the family named `name`; false if there is none.
template <typename Visit>
bool visit_family(const std::string &name, Visit &&visit) {
    return std::apply([&](auto... family) { return ((name == decltype(family)::name && (visit(family), true)) || ...); },
                      Families{});
}

std::string family_names() {
    std::string names;
    std::apply([&](auto... family) { ((names += (names.empty() ? "'" : ", '") + std::string(decltype(family)::name) + "'"), ...); },
               Families{});
    return names;
}

std::string family_of(py::handle kernel_cfg) {
    if (!py::hasattr(kernel_cfg, "family") || !py::isinstance<py::str>(kernel_cfg.attr("family")))
        throw py::type_error("kernel_cfg: expected a kernel configuration (an object with a 'family' name), got " +
                             type_name(kernel_cfg));
    return kernel_cfg.attr("family").cast<std::string>();
}

// Runs visit(Family{}, config) for kernel_cfg's family.
template <typename Visit>
void with_config(py::handle kernel_cfg, Visit &&visit) {
    const std::string family = family_of(kernel_cfg);
    if (!visit_family(family, [&](auto f) { visit(f, decltype(f)::from_python(kernel_cfg)); }))
        throw py::value_error("kernel_cfg: unknown kernel family '" + family + "'; this build has " + family_names());
}

std::string describe(const ProblemVariant &variant) {
    const char *masks[] = {"no mask", "a causal mask", "a local window"};
    return std::string(masks[static_cast<int>(variant.mask)]) +
           (variant.masked_tails ? ", lengths that are not multiples of the block sizes" : "") +
           (variant.score_mods ? ", softcap or ALiBi" : "");
}

template <typename Family>
const ForwardLauncher &lookup(const typename Family::Config &cfg, const ProblemVariant &variant) {
    const auto &kernels = Family::kernels();
    const auto it = kernels.find({cfg, variant});
    if (it != kernels.end())
        return it->second;
    const auto same_config = kernels.lower_bound({cfg, ProblemVariant{}});
    if (same_config != kernels.end() && same_config->first.first == cfg)
        throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " has no kernel for this problem (" +
                              describe(variant) + ") in this build (kernel set '" + compiled_kernel_set + "'); " +
                              rebuild_hint);
    throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " is not compiled into this build (kernel set '" +
                          compiled_kernel_set + "'); " + rebuild_hint);
}

// Built without iostreams: string streams inside an extension module have crashed on some
// systems whose C++ runtime differs from the one torch was built with.
std::string shape_str(const at::Tensor &t) {
    std::string text = "[";
    for (int dim = 0; dim < t.dim(); ++dim)
        text += (dim ? ", " : "") + std::to_string(t.size(dim));
    return text + "]";
}

at::Tensor tensor_argument(py::handle obj, const char *name) {
    if (!THPVariable_Check(obj.ptr()))
        throw py::type_error(std::string(name) + ": expected a torch.Tensor, got " + type_name(obj));
    return THPVariable_Unpack(obj.ptr());
}

// The rules one tensor must satisfy on its own.
void check_tensor(const at::Tensor &t, const char *name) {
    if (!t.is_cuda())
        throw py::value_error(std::string(name) + ": expected a CUDA tensor, got a tensor on " + t.device().str());
    if (t.scalar_type() != at::kHalf && t.scalar_type() != at::kBFloat16)
        throw py::type_error(std::string(name) + ": dtype must be float16 or bfloat16, got " +
                             std::string(c10::toString(t.scalar_type())));
    if (t.dim() != 4)
        throw py::value_error(std::string(name) + ": expected 4 dimensions (batch, seq, heads, d_head), got " +
                              std::to_string(t.dim()));
    if (t.size(3) > 1 && t.stride(3) != 1)
        throw py::value_error(std::string(name) + ": the last dimension (d_head) must be contiguous (stride 1), got stride " +
                              std::to_string(t.stride(3)));
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % COPY_BYTES != 0)
        throw py::value_error(std::string(name) + ": the data pointer must be 16-byte aligned");
    for (int dim = 0; dim < 3; ++dim)
        if (t.size(dim) > 1 && t.stride(dim) % ELEMS_PER_COPY != 0)
            throw py::value_error(std::string(name) + ": the batch, seq and head strides must be multiples of " +
                                  std::to_string(ELEMS_PER_COPY) + " elements (16 bytes), got strides " +
                                  std::to_string(t.stride(0)) + ", " + std::to_string(t.stride(1)) + ", " +
                                  std::to_string(t.stride(2)));
}

// The rules tying one tensor to q: device and dtype.
void check_device_and_dtype(const at::Tensor &t, const char *name, const at::Tensor &q) {
    if (t.device() != q.device())
        throw py::value_error(std::string(name) + ": is on " + t.device().str() + " but q is on " + q.device().str() +
                              "; all tensors must be on one device");
    if (t.scalar_type() != q.scalar_type())
        throw py::type_error(std::string(name) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                             " differs from q's " + std::string(c10::toString(q.scalar_type())));
}

// k and v: (batch, seqlen_k, heads_kv, d_head) with q's batch and d_head, heads_kv dividing
// heads_q; v of k's shape.
void check_kv_shapes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
    if (k.size(0) != q.size(0) || k.size(3) != q.size(3))
        throw py::value_error("k: shape " + shape_str(k) + " must be (batch, seqlen_k, heads_kv, d_head) with q's batch and "
                              "d_head, q being " + shape_str(q));
    if (k.size(2) == 0 || q.size(2) % k.size(2) != 0)
        throw py::value_error("k: heads_q (" + std::to_string(q.size(2)) + ") must be a multiple of heads_kv (" +
                              std::to_string(k.size(2)) + ")");
    if (v.sizes() != k.sizes())
        throw py::value_error("v: shape " + shape_str(v) + " differs from k's " + shape_str(k) +
                              "; k and v must have the same (batch, seqlen_k, heads_kv, d_head) shape");
}

// o: q's shape.
void check_matches_q(const at::Tensor &o, const at::Tensor &q) {
    check_device_and_dtype(o, "o", q);
    if (o.sizes() != q.sizes())
        throw py::value_error("o: shape " + shape_str(o) + " differs from q's " + shape_str(q) +
                              "; o must have q's (batch, seqlen_q, heads_q, d_head) shape");
}

// Byte range [first, last) that a strided tensor can touch.
std::pair<uintptr_t, uintptr_t> byte_extent(const at::Tensor &t) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(t.data_ptr());
    int64_t last_offset = 0;
    for (int dim = 0; dim < t.dim(); ++dim)
        last_offset += (t.size(dim) - 1) * t.stride(dim);
    return {first, first + (last_offset + 1) * t.element_size()};
}

void check_no_overlap(const at::Tensor &o, const at::Tensor &input, const char *input_name) {
    if (o.numel() == 0 || input.numel() == 0)
        return;
    const auto [o_first, o_last] = byte_extent(o);
    const auto [in_first, in_last] = byte_extent(input);
    if (o_first < in_last && in_first < o_last)
        throw py::value_error(std::string("o: overlaps ") + input_name +
                              " in memory; the output must not share memory with an input");
}

template <typename Family>
void check_device(const at::Tensor &q, const ForwardLauncher &launcher) {
    const cudaDeviceProp *props = at::cuda::getDeviceProperties(q.device().index());
    const int capability = props->major * 10 + props->minor;
    if (!Family::runs_on(capability))
        throw py::value_error("q: " + q.device().str() + " (" + props->name + ") is sm_" + std::to_string(capability) +
                              "; the " + Family::name + " kernels need " + Family::requirement + " (" +
                              Family::instructions + ")");
    if (static_cast<size_t>(launcher.smem_bytes) > props->sharedMemPerBlockOptin)
        throw py::value_error("kernel_cfg: needs " + std::to_string(launcher.smem_bytes) +
                              " bytes of shared memory per block; " + q.device().str() + " allows " +
                              std::to_string(props->sharedMemPerBlockOptin));
}

TensorStrides strides_of(const at::Tensor &t) { return TensorStrides{t.stride(0), t.stride(1), t.stride(2)}; }

int seqlen_of(const at::Tensor &t, const char *name) {
    if (t.size(1) > MAX_SEQLEN)
        throw py::value_error(std::string(name) + ": sequence length " + std::to_string(t.size(1)) + " exceeds " +
                              std::to_string(MAX_SEQLEN));
    return static_cast<int>(t.size(1));
}

// The problem-side arguments of one call, as Python gave them.
struct ProblemArguments {
    bool causal;
    py::handle softmax_scale; // None: 1 / sqrt(d_head)
    py::handle window_left;
    py::handle window_right;
    py::handle softcap;
    py::handle alibi_slopes; // None or a tensor
    bool return_lse;
};

int window_side(py::handle value, const char *side) {
    if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value))
        throw py::type_error(std::string("window_size: ") + side + " must be an int, got " + type_name(value));
    const long long v = value.cast<long long>();
    if (v < -1)
        throw py::value_error(std::string("window_size: ") + side + " must be -1 (unbounded) or >= 0, got " +
                              std::to_string(v));
    return static_cast<int>(std::min<long long>(v, UNBOUNDED_WINDOW));
}

float finite_float(py::handle value, const char *name) {
    if (py::isinstance<py::bool_>(value) || !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)))
        throw py::type_error(std::string(name) + ": expected a float, got " + type_name(value));
    const double v = value.cast<double>();
    if (!std::isfinite(v))
        throw py::value_error(std::string(name) + ": must be finite, got " + std::to_string(v));
    return static_cast<float>(v);
}

// Fills params.softmax_scale and params.mask, and names the mask kind and whether the scores are
// modified. A window side that reaches past every key is unbounded, so the variant is the cheapest
// that computes the same result.
std::pair<MaskKind, bool> describe_problem(const ProblemArguments &args, const at::Tensor &q, ForwardParams &params) {
    params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(params.d_head));
    if (!args.softmax_scale.is_none()) {
        params.softmax_scale = finite_float(args.softmax_scale, "softmax_scale");
        if (!(params.softmax_scale > 0.0f))
            throw py::value_error("softmax_scale: must be a finite positive number, got " + std::to_string(params.softmax_scale));
    }
    const float softcap = finite_float(args.softcap, "softcap");
    if (softcap < 0.0f)
        throw py::value_error("softcap: must be >= 0 (0 turns it off), got " + std::to_string(softcap));

    const int left = window_side(args.window_left, "left");
    const int given_right = window_side(args.window_right, "right"); // checked even where causal overrides it
    const int right = args.causal ? 0 : given_right;
    // Left bounds nothing when even the last query's window reaches key 0; right, when even the
    // first query's reaches the last key.
    const bool left_bounded = left >= 0 && left < params.seqlen_k - 1;
    const bool right_bounded = right >= 0 && right < params.seqlen_q - 1;
    params.mask.window_left = left_bounded ? left : UNBOUNDED_WINDOW;
    params.mask.window_right = right_bounded ? right : UNBOUNDED_WINDOW;
    const MaskKind mask = !left_bounded && !right_bounded            ? MaskKind::NONE
                          : !left_bounded && right_bounded && right == 0 ? MaskKind::CAUSAL
                                                                        : MaskKind::LOCAL;
    params.mask.softcap = softcap;

    params.mask.alibi_slopes = nullptr;
    params.mask.alibi_batch_stride = 0;
    if (!args.alibi_slopes.is_none()) {
        const at::Tensor slopes = tensor_argument(args.alibi_slopes, "alibi_slopes");
        if (slopes.scalar_type() != at::kFloat)
            throw py::type_error("alibi_slopes: dtype must be float32, got " + std::string(c10::toString(slopes.scalar_type())));
        if (slopes.device() != q.device())
            throw py::value_error("alibi_slopes: is on " + slopes.device().str() + " but q is on " + q.device().str());
        const bool per_head = slopes.dim() == 1 && slopes.size(0) == params.heads_q;
        const bool per_batch = slopes.dim() == 2 && slopes.size(0) == params.batch && slopes.size(1) == params.heads_q;
        if (!per_head && !per_batch)
            throw py::value_error("alibi_slopes: shape " + shape_str(slopes) + " must be (heads_q,) = (" +
                                  std::to_string(params.heads_q) + ",) or (batch, heads_q) = (" +
                                  std::to_string(params.batch) + ", " + std::to_string(params.heads_q) + ")");
        if (slopes.size(-1) > 1 && slopes.stride(-1) != 1)
            throw py::value_error("alibi_slopes: the heads dimension must be contiguous (stride 1)");
        params.mask.alibi_slopes = slopes.data_ptr<float>();
        params.mask.alibi_batch_stride = per_batch ? slopes.stride(0) : 0;
    }
    return {mask, softcap > 0.0f || params.mask.alibi_slopes != nullptr};
}

template <typename Family>
py::tuple forward_with(const typename Family::Config &cfg, py::handle q_obj, py::handle k_obj, py::handle v_obj,
                       py::handle o_obj, bool benchmark, const ProblemArguments &problem) {
    const at::Tensor q = tensor_argument(q_obj, "q");
    const at::Tensor k = tensor_argument(k_obj, "k");
    const at::Tensor v = tensor_argument(v_obj, "v");
    check_tensor(q, "q");
    check_tensor(k, "k");
    check_tensor(v, "v");
    check_device_and_dtype(k, "k", q);
    check_device_and_dtype(v, "v", q);
    check_kv_shapes(q, k, v);
    const at::ScalarType cfg_dtype = Family::dtype(cfg) == DType::FP16 ? at::kHalf : at::kBFloat16;
    if (q.scalar_type() != cfg_dtype)
        throw py::type_error("q: dtype " + std::string(c10::toString(q.scalar_type())) +
                             " does not match kernel_cfg.dtype (" + std::string(c10::toString(cfg_dtype)) + ")");
    if (q.size(3) != Family::d_head(cfg))
        throw py::value_error("q: d_head (last dimension) is " + std::to_string(q.size(3)) +
                              " but kernel_cfg.d_head is " + std::to_string(Family::d_head(cfg)));
    if (q.size(0) > 65535 || q.size(2) > 65535)
        throw py::value_error("q: batch and heads must each be at most 65535 (CUDA grid limits), got batch " +
                              std::to_string(q.size(0)) + ", heads " + std::to_string(q.size(2)));

    at::Tensor o;
    if (o_obj.is_none()) {
        const c10::cuda::CUDAGuard guard(q.device());
        o = at::empty(q.sizes(), q.options());
    } else {
        o = tensor_argument(o_obj, "o");
        check_tensor(o, "o");
        check_matches_q(o, q);
        check_no_overlap(o, q, "q");
        check_no_overlap(o, k, "k");
        check_no_overlap(o, v, "v");
    }

    ForwardParams params{};
    params.q = q.data_ptr();
    params.k = k.data_ptr();
    params.v = v.data_ptr();
    params.o = o.data_ptr();
    params.q_strides = strides_of(q);
    params.k_strides = strides_of(k);
    params.v_strides = strides_of(v);
    params.o_strides = strides_of(o);
    params.batch = static_cast<int>(q.size(0));
    params.seqlen_q = seqlen_of(q, "q");
    params.seqlen_k = seqlen_of(k, "k");
    params.heads_q = static_cast<int>(q.size(2));
    params.heads_kv = static_cast<int>(k.size(2));
    params.d_head = static_cast<int>(q.size(3));
    const auto [mask, score_mods] = describe_problem(problem, q, params);

    at::Tensor lse;
    if (problem.return_lse) {
        const c10::cuda::CUDAGuard guard(q.device());
        lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
        params.lse = lse.data_ptr<float>();
    }
    const py::object lse_result = problem.return_lse ? py::cast(lse) : py::object(py::none());

    // Score modifications come only with masked tails (that kernel serves whole blocks too).
    const ProblemVariant variant{mask, score_mods || Family::needs_masked_tails(cfg, params), score_mods};
    const ForwardLauncher &launcher = lookup<Family>(cfg, variant);
    check_device<Family>(q, launcher);
    if (params.batch == 0 || params.seqlen_q == 0 || params.heads_q == 0)
        return py::make_tuple(o, lse_result, benchmark ? py::object(py::float_(0.0)) : py::object(py::none()));
    if (params.seqlen_k == 0) {
        // No key at all: every row attends nothing.
        o.zero_();
        if (problem.return_lse)
            lse.fill_(std::numeric_limits<float>::infinity());
        return py::make_tuple(o, lse_result, benchmark ? py::object(py::float_(0.0)) : py::object(py::none()));
    }

    const c10::cuda::CUDAGuard guard(q.device());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
    at::Tensor work_counter; // zeroed on the kernel's stream, by a memset that compute-sanitizer's initcheck sees
    if (launcher.needs_work_counter) {
        work_counter = at::empty({1}, q.options().dtype(at::kInt));
        params.work_counter = work_counter.data_ptr<int>();
        check_cuda(cudaMemsetAsync(params.work_counter, 0, sizeof(int), stream), "zeroing the work counter");
    }
    if (!benchmark) {
        launcher.launch(params, stream);
        return py::make_tuple(o, lse_result, py::none());
    }
    EventTimer timer(stream);
    timer.start();
    launcher.launch(params, stream);
    timer.stop();
    return py::make_tuple(o, lse_result, timer.elapsed_ms());
}

py::tuple forward(py::handle kernel_cfg, py::handle q, py::handle k, py::handle v, py::handle o, bool benchmark,
                  bool causal, py::handle softmax_scale, py::handle window_left, py::handle window_right,
                  py::handle softcap, py::handle alibi_slopes, bool return_lse) {
    const ProblemArguments problem{causal, softmax_scale, window_left, window_right, softcap, alibi_slopes, return_lse};
    py::tuple result;
    with_config(kernel_cfg, [&](auto family, const auto &cfg) {
        result = forward_with<decltype(family)>(cfg, q, k, v, o, benchmark, problem);
    });
    return result;
}

// (family name, configuration fields, (mask kind, masked tails, score mods)) of every compiled
// kernel, in the registries' order.
py::list compiled_kernels() {
    py::list kernels;
    std::apply(
        [&](auto... family) {
            (
                [&] {
                    using Family = decltype(family);
                    for (const auto &[key, launcher] : Family::kernels()) {
                        const auto &[cfg, variant] = key;
                        kernels.append(py::make_tuple(
                            Family::name, Family::to_python(cfg),
                            py::make_tuple(static_cast<int>(variant.mask), variant.masked_tails, variant.score_mods)));
                    }
                }(),
                ...);
        },
        Families{});
    return kernels;
}

// Attributes of the kernel compiled for kernel_cfg (its first problem variant: they share the tuning).
py::dict kernel_attributes(py::handle kernel_cfg) {
    py::dict result;
    with_config(kernel_cfg, [&](auto family, const auto &cfg) {
        using Family = decltype(family);
        const auto &kernels = Family::kernels();
        const auto entry = kernels.lower_bound({cfg, ProblemVariant{}});
        const ForwardLauncher &launcher =
            entry != kernels.end() && entry->first.first == cfg ? entry->second : lookup<Family>(cfg, ProblemVariant{});
        cudaFuncAttributes attributes{};
        check_cuda(cudaFuncGetAttributes(&attributes, launcher.kernel), "cudaFuncGetAttributes");
        result["registers"] = attributes.numRegs;
        result["local_bytes"] = attributes.localSizeBytes;
        result["static_smem_bytes"] = attributes.sharedSizeBytes;
        result["dynamic_smem_bytes"] = launcher.smem_bytes;
        result["max_threads_per_block"] = attributes.maxThreadsPerBlock;
    });
    return result;
}

} // namespace
} // namespace flash

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashAttention-2 forward kernels written from scratch, one per compiled configuration.";
    m.def("forward", &flash::forward, py::arg("kernel_cfg"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("o") = py::none(), py::arg("benchmark") = false, py::kw_only(), py::arg("causal") = false,
          py::arg("softmax_scale") = py::none(), py::arg("window_left") = -1, py::arg("window_right") = -1,
          py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(), py::arg("return_lse") = false,
          "forward(kernel_cfg, q, k, v, o=None, benchmark=False, *, causal=False, softmax_scale=None, "
          "window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, return_lse=False) "
          "-> (o, lse or None, runtime_ms or None)\n\n"
          "Attention (FlashAttention-2's semantics) with the kernel compiled for kernel_cfg and the problem's "
          "variant, launched on the current stream; with benchmark=True also returns its run time in "
          "milliseconds.");
    m.def("compiled_kernels", &flash::compiled_kernels,
          "The compiled kernels as (family, configuration fields, (mask kind, masked tails, score mods)), in the "
          "registries' order.");
    m.def("compiled_kernel_set", [] { return std::string(flash::compiled_kernel_set); },
          "The name of the kernel set this module was built with (FLASH_BUILD_KERNELS).");
    // nvcc names the targets of every compilation, host code included, in __CUDA_ARCH_LIST__; the
    // kernels' translation units are compiled with the same targets as this one.
    m.def("compiled_architectures", [] { return std::vector<int>{__CUDA_ARCH_LIST__}; },
          "The GPU architectures this module has code for, as nvcc numbers them (800, 900, ...).");
    m.def("kernel_attributes", &flash::kernel_attributes, py::arg("kernel_cfg"),
          "Registers, local (spill) bytes, static and dynamic shared memory of a compiled kernel.");
}
