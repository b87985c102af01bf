// The Python binding: validates the arguments, builds the call's parameter block, looks the kernel
// up in the registry by (family configuration, problem variant) and has its launcher run it on the
// current torch stream. It holds no kernel code and no launch geometry: those are the families'.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "common/common.h"
#include "common/cuda_utils.cuh"
#include "common/forward_params.h"
#include "common/python_fields.h"
#include "generated/kernel_registry.h"
#include "sm80/binding.h"

namespace py = pybind11;

namespace flash {
namespace {

// Every kernel family of this build. A new family adds its binding header above and its Family here.
using Families = std::tuple<sm80::Family>;

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

template <typename Family>
const ForwardLauncher &lookup(const typename Family::Config &cfg, const ProblemVariant &variant) {
    const auto &kernels = Family::kernels();
    const auto it = kernels.find({cfg, variant});
    if (it == kernels.end())
        throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " is not compiled into this build (kernel set '" +
                              compiled_kernel_set + "'); " + rebuild_hint);
    return it->second;
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

// The rules tying one tensor to q.
void check_matches_q(const at::Tensor &t, const char *name, const at::Tensor &q) {
    if (t.device() != q.device())
        throw py::value_error(std::string(name) + ": is on " + t.device().str() + " but q is on " + q.device().str() +
                              "; all tensors must be on one device");
    if (t.scalar_type() != q.scalar_type())
        throw py::type_error(std::string(name) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                             " differs from q's " + std::string(c10::toString(q.scalar_type())));
    if (t.sizes() != q.sizes())
        throw py::value_error(std::string(name) + ": shape " + shape_str(t) + " differs from q's " + shape_str(q) +
                              "; q, k, v and o must have the same (batch, seq, heads, d_head) shape");
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
    if (capability < Family::min_compute_capability)
        throw py::value_error("q: " + q.device().str() + " (" + props->name + ") is sm_" + std::to_string(capability) +
                              "; the " + Family::name + " kernels need sm_" +
                              std::to_string(Family::min_compute_capability) + " or newer (" + Family::instructions +
                              ")");
    if (static_cast<size_t>(launcher.smem_bytes) > props->sharedMemPerBlockOptin)
        throw py::value_error("kernel_cfg: needs " + std::to_string(launcher.smem_bytes) +
                              " bytes of shared memory per block; " + q.device().str() + " allows " +
                              std::to_string(props->sharedMemPerBlockOptin));
}

TensorStrides strides_of(const at::Tensor &t) { return TensorStrides{t.stride(0), t.stride(1), t.stride(2)}; }

int int_extent(int64_t value, const char *what) {
    if (value > std::numeric_limits<int>::max())
        throw py::value_error(std::string("q: ") + what + " " + std::to_string(value) + " exceeds 2^31 - 1");
    return static_cast<int>(value);
}

template <typename Family>
py::tuple forward_with(const typename Family::Config &cfg, py::handle q_obj, py::handle k_obj, py::handle v_obj,
                       py::handle o_obj, bool benchmark) {
    const at::Tensor q = tensor_argument(q_obj, "q");
    const at::Tensor k = tensor_argument(k_obj, "k");
    const at::Tensor v = tensor_argument(v_obj, "v");
    check_tensor(q, "q");
    check_tensor(k, "k");
    check_tensor(v, "v");
    check_matches_q(k, "k", q);
    check_matches_q(v, "v", q);
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
        check_matches_q(o, "o", q);
        check_no_overlap(o, q, "q");
        check_no_overlap(o, k, "k");
        check_no_overlap(o, v, "v");
    }

    ForwardParams params{};
    params.q = q.data_ptr();
    params.k = k.data_ptr();
    params.v = v.data_ptr();
    params.o = o.data_ptr();
    params.lse = nullptr;
    params.q_strides = strides_of(q);
    params.k_strides = strides_of(k);
    params.v_strides = strides_of(v);
    params.o_strides = strides_of(o);
    params.batch = static_cast<int>(q.size(0));
    params.seqlen_q = int_extent(q.size(1), "seqlen_q");
    params.seqlen_k = int_extent(k.size(1), "seqlen_k");
    params.heads_q = static_cast<int>(q.size(2));
    params.heads_kv = static_cast<int>(k.size(2));
    params.d_head = static_cast<int>(q.size(3));
    params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(params.d_head));
    params.mask = MaskParams{false, -1, -1, 0.0f, nullptr, 0};

    const ForwardLauncher &launcher = lookup<Family>(cfg, Family::variant(cfg, params));
    check_device<Family>(q, launcher);
    if (params.batch == 0 || params.seqlen_q == 0 || params.heads_q == 0)
        return py::make_tuple(o, benchmark ? py::object(py::float_(0.0)) : py::object(py::none()));

    const c10::cuda::CUDAGuard guard(q.device());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
    if (!benchmark) {
        launcher.launch(params, stream);
        return py::make_tuple(o, py::none());
    }
    EventTimer timer(stream);
    timer.start();
    launcher.launch(params, stream);
    timer.stop();
    return py::make_tuple(o, timer.elapsed_ms());
}

py::tuple forward(py::handle kernel_cfg, py::handle q, py::handle k, py::handle v, py::handle o, bool benchmark) {
    py::tuple result;
    with_config(kernel_cfg, [&](auto family, const auto &cfg) {
        result = forward_with<decltype(family)>(cfg, q, k, v, o, benchmark);
    });
    return result;
}

// (family name, configuration fields) of every compiled kernel, each configuration once.
py::list compiled_configs() {
    py::list configs;
    std::apply(
        [&](auto... family) {
            (
                [&] {
                    using Family = decltype(family);
                    const typename Family::Config *previous = nullptr;
                    for (const auto &[key, launcher] : Family::kernels()) {
                        if (!previous || *previous != key.first)
                            configs.append(py::make_tuple(Family::name, Family::to_python(key.first)));
                        previous = &key.first;
                    }
                }(),
                ...);
        },
        Families{});
    return configs;
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
          py::arg("o") = py::none(), py::arg("benchmark") = false,
          "forward(kernel_cfg, q, k, v, o=None, benchmark=False) -> (o, runtime_ms or None)\n\n"
          "Attention over (batch, seq, heads, d_head) CUDA tensors with the kernel compiled for kernel_cfg, "
          "launched on the current stream; with benchmark=True also returns its run time in milliseconds.");
    m.def("compiled_configs", &flash::compiled_configs,
          "The compiled configurations as (family, fields) pairs, in the registry's order.");
    m.def("compiled_kernel_set", [] { return std::string(flash::compiled_kernel_set); },
          "The name of the kernel set this module was built with (FLASH_BUILD_KERNELS).");
    m.def("kernel_attributes", &flash::kernel_attributes, py::arg("kernel_cfg"),
          "Registers, local (spill) bytes, static and dynamic shared memory of a compiled kernel.");
}
