// The Python module: one forward call (the configuration named, or chosen here from the dispatch
// tables), the choice alone (choose_config's), and what the build compiled. A call validates its
// arguments (src/binding/), builds the parameter block once, looks the kernel up in the registry by
// (family configuration, problem variant) and has its launcher run it on the current torch stream.
// It holds no kernel code and no launch geometry: those are the families'.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/dispatch.h"
#include "binding/families.h"
#include "binding/problem.h"
#include "binding/tensor_checks.h"
#include "common/cuda_utils.cuh"
#include "common/forward_params.h"
#include "generated/kernel_registry.h"

namespace py = pybind11;

namespace flash::binding {
namespace {

DType dtype_of(const at::Tensor &t) { return t.scalar_type() == at::kHalf ? DType::FP16 : DType::BF16; }

const char *dtype_name(DType dtype) { return dtype == DType::FP16 ? "float16" : "bfloat16"; }

std::string describe(const ProblemVariant &variant) {
    const char *masks[] = {"no mask", "a causal mask", "a local window"};
    return std::string(masks[static_cast<int>(variant.mask)]) +
           (variant.masked_tails ? ", lengths that are not multiples of the block sizes" : "") +
           (variant.score_mods ? ", softcap or ALiBi" : "");
}

std::string arch_of(int capability) { return "sm_" + std::to_string(capability); }

// The kernel of a configuration named by the caller, for this problem on this GPU.
const ForwardLauncher &named_kernel(const AnyConfig &config, const at::Tensor &q, const ForwardParams &params,
                                    const Problem &problem, const Gpu &gpu) {
    return visit_config(config, [&](auto family, const auto &cfg) -> const ForwardLauncher & {
        using Family = decltype(family);
        const at::ScalarType cfg_dtype = cfg.dtype == DType::FP16 ? at::kHalf : at::kBFloat16;
        if (q.scalar_type() != cfg_dtype)
            throw py::type_error("q: dtype " + dtype_str(q) + " does not match kernel_cfg.dtype (" +
                                 std::string(c10::toString(cfg_dtype)) + ")");
        if (params.d_head != cfg.d_head)
            throw py::value_error("q: d_head (last dimension) is " + std::to_string(params.d_head) +
                                  " but kernel_cfg.d_head is " + std::to_string(cfg.d_head));
        const ProblemVariant variant = Family::variant_for(cfg, params, problem.mask, problem.score_mods);
        const ForwardLauncher *launcher = Family::find(cfg, variant);
        const std::string build = " in this build (kernel set '" + std::string(compiled_kernel_set) + "'); " + rebuild_hint;
        if (launcher == nullptr && Family::is_compiled(cfg))
            throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " has no kernel for this problem (" +
                                  describe(variant) + ")" + build);
        if (launcher == nullptr)
            throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " is not compiled" + build);
        if (!Family::runs_on(gpu.capability))
            throw py::value_error("q: " + q.device().str() + " is " + arch_of(gpu.capability) + "; " +
                                  Family::cannot_run_reason(gpu.capability));
        if (launcher->smem_bytes > gpu.smem_per_block)
            throw py::value_error("kernel_cfg: needs " + std::to_string(launcher->smem_bytes) +
                                  " bytes of shared memory per block; " + q.device().str() + " allows " +
                                  std::to_string(gpu.smem_per_block));
        return *launcher;
    });
}

// The message of a problem that no compiled kernel runs on this GPU.
std::string no_kernel_message(DType dtype, const ForwardParams &params, const Problem &problem, const Gpu &gpu) {
    std::string reasons;
    bool any_family_runs = false;
    for_each_family([&](auto family) {
        using Family = decltype(family);
        any_family_runs = any_family_runs || Family::runs_on(gpu.capability);
        if (!Family::runs_on(gpu.capability))
            reasons += "; " + Family::cannot_run_reason(gpu.capability);
    });
    std::string text = "q: no configuration compiled into this build (kernel set '" + std::string(compiled_kernel_set) +
                       "') runs " + dtype_name(dtype) + " attention with d_head " + std::to_string(params.d_head) + " and " +
                       describe(ProblemVariant{problem.mask, false, problem.score_mods}) + " on " + arch_of(gpu.capability) +
                       " (" + std::to_string(gpu.smem_per_block) + " bytes of shared memory per block)";
    return any_family_runs ? text + reasons + "; " + rebuild_hint : text + reasons;
}

Choice automatic_kernel(DType dtype, const ForwardParams &params, const Problem &problem, const Gpu &gpu) {
    std::optional<Choice> choice = choose(dtype, params, problem.mask, problem.score_mods, gpu);
    if (!choice)
        throw py::value_error(no_kernel_message(dtype, params, problem, gpu));
    return *choice;
}

Gpu gpu_of(const at::Tensor &q) {
    const cudaDeviceProp *props = at::cuda::getDeviceProperties(q.device().index());
    return Gpu{props->major * 10 + props->minor, static_cast<int64_t>(props->sharedMemPerBlockOptin)};
}

// q, k and v checked, and the parameter block's problem side decoded from them and the arguments.
Problem checked_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const ProblemArguments &args,
                        bool on_device, ForwardParams &params) {
    check_tensor(q, "q", on_device);
    check_tensor(k, "k", on_device);
    check_tensor(v, "v", on_device);
    check_device_and_dtype(k, "k", q);
    check_device_and_dtype(v, "v", q);
    check_shapes(q, k, v);
    return decode_problem(args, q, k, params);
}

py::object optional(bool present, py::object value) { return present ? std::move(value) : py::none(); }

// With heads_first, q, k, v and the output o are (batch, heads, seq, d_head) (SDPA's layout): the
// kernels read them through their strides as (batch, seq, heads, d_head) views.
py::tuple forward(py::handle kernel_cfg, py::handle q_obj, py::handle k_obj, py::handle v_obj, py::handle o_obj,
                  bool benchmark, bool causal, py::handle softmax_scale, py::handle window_size, py::handle softcap,
                  py::handle alibi_slopes, bool return_lse, bool heads_first) {
    // The configuration and the other arguments first: a bad one is named whatever the tensors are.
    const std::optional<AnyConfig> named = kernel_cfg.is_none() ? std::nullopt : std::optional(config_from_python(kernel_cfg));
    const ProblemArguments args = problem_arguments(causal, softmax_scale, window_size, softcap, alibi_slopes);
    const auto as_sequence_first = [&](py::handle obj, const char *name) {
        const at::Tensor t = tensor_argument(obj, name);
        return heads_first && t.dim() == 4 ? t.transpose(1, 2) : t;
    };
    if (heads_first && !o_obj.is_none())
        throw py::value_error("o: must be None with heads_first (the output is allocated in that layout)");
    const at::Tensor q = as_sequence_first(q_obj, "q");
    const at::Tensor k = as_sequence_first(k_obj, "k");
    const at::Tensor v = as_sequence_first(v_obj, "v");
    ForwardParams params{};
    const Problem problem = checked_problem(q, k, v, args, true, params);
    const Gpu gpu = gpu_of(q);
    const ForwardLauncher &launcher =
        named ? named_kernel(*named, q, params, problem, gpu) : *automatic_kernel(dtype_of(q), params, problem, gpu).launcher;

    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor o;
    if (o_obj.is_none() && heads_first) {
        o = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
    } else if (o_obj.is_none()) {
        o = at::empty(q.sizes(), q.options());
    } else {
        o = tensor_argument(o_obj, "o");
        check_output(o, q, k, v);
    }
    at::Tensor lse;
    if (return_lse) {
        lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
        params.lse = lse.data_ptr<float>();
    }
    const auto result = [&](std::optional<float> runtime_ms) {
        return py::make_tuple(heads_first ? o.transpose(1, 2) : o, optional(return_lse, py::cast(lse)),
                              optional(benchmark, py::float_(runtime_ms.value_or(0.0f))));
    };
    if (params.batch == 0 || params.seqlen_q == 0 || params.heads_q == 0)
        return result(std::nullopt);
    if (params.seqlen_k == 0) {
        // No key at all: every row attends nothing.
        o.zero_();
        if (return_lse)
            lse.fill_(std::numeric_limits<float>::infinity());
        return result(std::nullopt);
    }

    params.q = q.data_ptr();
    params.k = k.data_ptr();
    params.v = v.data_ptr();
    params.o = o.data_ptr();
    const auto strides_of = [](const at::Tensor &t) { return TensorStrides{t.stride(0), t.stride(1), t.stride(2)}; };
    params.q_strides = strides_of(q);
    params.k_strides = strides_of(k);
    params.v_strides = strides_of(v);
    params.o_strides = strides_of(o);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
    at::Tensor work_counter; // zeroed on the kernel's stream, by a memset that compute-sanitizer's initcheck sees
    if (launcher.needs_work_counter) {
        work_counter = at::empty({1}, q.options().dtype(at::kInt));
        params.work_counter = work_counter.data_ptr<int>();
        check_cuda(cudaMemsetAsync(params.work_counter, 0, sizeof(int), stream), "zeroing the work counter");
    }
    if (!benchmark) {
        launcher.launch(params, stream);
        return result(std::nullopt);
    }
    EventTimer timer(stream);
    timer.start();
    launcher.launch(params, stream);
    timer.stop();
    return result(timer.elapsed_ms());
}

// The automatic choice for a problem, without running it: (family, configuration fields, (mask
// kind, masked tails, score mods), place in the table entry or 0, the entry's length or 0, the
// entry's ranked count or 0, why the rule chose (RuleReason), whether it is in the default set).
// q and k may be on any device (the meta device too); the GPU is named by its compute capability
// (major * 10 + minor) and a block's opt-in shared memory.
py::tuple choose_kernel(py::handle q_obj, py::handle k_obj, bool causal, py::handle window_size, py::handle softcap,
                        py::handle alibi_slopes, int capability, int64_t smem_per_block) {
    const ProblemArguments args = problem_arguments(causal, py::none(), window_size, softcap, alibi_slopes);
    const at::Tensor q = tensor_argument(q_obj, "q");
    const at::Tensor k = tensor_argument(k_obj, "k");
    ForwardParams params{};
    const Problem problem = checked_problem(q, k, k, args, false, params);
    const Choice choice = automatic_kernel(dtype_of(q), params, problem, Gpu{capability, smem_per_block});
    const TableEntry *entry = choice.entry;
    return py::make_tuple(config_to_python(choice.config),
                          py::make_tuple(static_cast<int>(choice.variant.mask), choice.variant.masked_tails,
                                         choice.variant.score_mods),
                          choice.place, entry ? entry->seq_len : 0, entry ? static_cast<int>(entry->ranked.size()) : 0,
                          static_cast<int>(choice.rule), choice.is_default);
}

// Takes the dispatch tables and the default set from Python, replacing any earlier ones: tables is
// a list of (capability, entries), each entry (dtype code, d_head, causal, seq_len, [(configuration,
// time_ms), ...] fastest first); defaults a list of configurations.
void load_dispatch_tables(py::list tables, py::list defaults) {
    DispatchTables loaded;
    for (py::handle table : tables) {
        const auto [capability, entries] = table.cast<std::pair<int, py::list>>();
        for (py::handle item : entries) {
            const auto [dtype, d_head, causal, seq_len, ranked] = item.cast<std::tuple<int, int, bool, int, py::list>>();
            TableEntry entry{static_cast<DType>(dtype), d_head, causal, seq_len, {}};
            for (py::handle pair : ranked)
                entry.ranked.push_back({config_from_python(pair[py::int_(0)]), pair[py::int_(1)].cast<double>()});
            loaded.entries[capability].push_back(std::move(entry));
        }
    }
    for (py::handle config : defaults)
        loaded.defaults.insert(config_from_python(config));
    DispatchTables::instance() = std::move(loaded);
}

// The tiles a configuration of B_r x B_c blocks visits for one (batch, head), as the automatic
// choice counts them (exposed so the tests compare it with the Python tools' count).
int64_t visited_tiles_of(int B_r, int B_c, int seqlen_q, int seqlen_k, bool causal, py::handle window_size) {
    MaskParams mask{};
    set_window(mask, causal, window_argument(window_size), seqlen_q, seqlen_k);
    return visited_tiles(B_r, B_c, seqlen_q, seqlen_k, mask);
}

// (family name, configuration fields, (mask kind, masked tails, score mods)) of every compiled
// kernel, in the registries' order.
py::list compiled_kernels() {
    py::list kernels;
    for_each_family([&](auto family) {
        using Family = decltype(family);
        for (const auto &[key, launcher] : Family::kernels()) {
            const auto &[cfg, variant] = key;
            kernels.append(py::make_tuple(Family::name, Family::to_python(cfg),
                                          py::make_tuple(static_cast<int>(variant.mask), variant.masked_tails, variant.score_mods)));
        }
    });
    return kernels;
}

// Attributes of the kernel compiled for kernel_cfg (its first problem variant: they share the tuning).
py::dict kernel_attributes(py::handle kernel_cfg) {
    py::dict result;
    visit_config(config_from_python(kernel_cfg), [&](auto family, const auto &cfg) {
        using Family = decltype(family);
        if (!Family::is_compiled(cfg))
            throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " is not compiled into this build (kernel set '" +
                                  compiled_kernel_set + "'); " + rebuild_hint);
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
            cudaGetLastError(); // the failed query leaves no error behind for the next CUDA call
            throw py::value_error("kernel_cfg: reading a kernel's attributes needs a CUDA GPU, and none is visible");
        }
        const auto &launcher = Family::kernels().lower_bound({cfg, ProblemVariant{}})->second;
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
} // namespace flash::binding

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    namespace binding = flash::binding;
    m.doc() = "FlashAttention-2 forward kernels written from scratch, one per compiled configuration.";
    m.def("forward", &binding::forward, py::arg("kernel_cfg"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("o") = py::none(), py::arg("benchmark") = false, py::arg("causal") = false,
          py::arg("softmax_scale") = py::none(), py::arg("window_size") = py::make_tuple(-1, -1),
          py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(), py::arg("return_lse") = false,
          py::arg("heads_first") = false,
          "forward(kernel_cfg, q, k, v, o=None, benchmark=False, causal=False, softmax_scale=None, "
          "window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_lse=False, heads_first=False) "
          "-> (o, lse or None, runtime_ms or None)\n\n"
          "Attention (FlashAttention-2's semantics) with the kernel compiled for kernel_cfg (None: chosen from the "
          "dispatch tables) and the problem's variant, launched on the current stream; with benchmark=True also "
          "returns its run time in milliseconds. q, k, v and o are (batch, seq, heads, d_head), or with "
          "heads_first (batch, heads, seq, d_head), o then allocated here.");
    m.def("choose", &binding::choose_kernel, py::arg("q"), py::arg("k"), py::arg("causal"), py::arg("window_size"),
          py::arg("softcap"), py::arg("alibi_slopes"), py::arg("capability"), py::arg("smem_per_block"),
          "The automatic choice for a problem on a GPU of this compute capability (major * 10 + minor) and shared "
          "memory per block, without running it.");
    m.def("load_dispatch_tables", &binding::load_dispatch_tables, py::arg("tables"), py::arg("defaults"),
          "Takes the dispatch tables and the default set that the automatic choice reads.");
    m.def("visited_tiles", &binding::visited_tiles_of, py::arg("B_r"), py::arg("B_c"), py::arg("seqlen_q"),
          py::arg("seqlen_k"), py::arg("causal") = false, py::arg("window_size") = py::make_tuple(-1, -1),
          "The (query block, key tile) pairs a B_r x B_c configuration visits per (batch, head).");
    m.def("compiled_kernels", &binding::compiled_kernels,
          "The compiled kernels as (family, configuration fields, (mask kind, masked tails, score mods)), in the "
          "registries' order.");
    m.def("compiled_kernel_set", [] { return std::string(flash::compiled_kernel_set); },
          "The name of the kernel set this module was built with (FLASH_BUILD_KERNELS).");
    m.def("compiled_architectures", [] { return binding::compiled_architectures(); },
          "The GPU architectures this module has machine code for, as nvcc numbers them (800, 900, ...).");
    m.def("kernel_attributes", &binding::kernel_attributes, py::arg("kernel_cfg"),
          "Registers, local (spill) bytes, static and dynamic shared memory of a compiled kernel.");
}
