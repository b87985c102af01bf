// Splitting the keys of a call over several blocks (SplitKV in common/forward_params.h): whether
// and how many splits, which kernel runs them, and the partial buffers. Few query rows against many
// keys leave most multiprocessors idle with one block per query block (decoding: one query per
// sequence); num_splits blocks per query block, each over a contiguous run of the key tiles, fill
// them, and a combine kernel merges their results. Only families whose FamilyInfo says
// splits_keys run them, with their varlen variant (whose tile ranges may be empty).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/dispatch.h"
#include "binding/families.h"
#include "binding/problem.h"
#include "common/forward_params.h"
#include "split_kv/combine.h"

namespace flash::binding {

// A split gets at least this many key tiles, so that its block's pipeline has something to overlap.
constexpr int MIN_TILES_PER_SPLIT = 2;
// Fewer key tiles than this run whole: splitting them takes too few tiles off a block's walk to pay
// for the combine's launch and the partial buffers (H200, d_head 128, CUDA-graph replays: 4 tiles
// ran 8.6 us whole and 9.3 split in 2, 6 tiles 10.8 whole and 9.2 split in 3; plus ~5 us of host
// time per split call; benchmarks/HISTORY.md #2026-11-26-short-caches).
constexpr int MIN_TILES_TO_SPLIT = 6;
// Blocks of a splitting configuration resident per multiprocessor (two fit its shared memory).
constexpr int BLOCKS_PER_SM = 2;
// The heuristic takes the fewest splits whose waves are at least this fraction as full as the best
// count's (a wave of blocks that is mostly empty costs as much as a full one, and each block's reads
// are bound by their latency, so every empty slot costs bandwidth: at 1 x 128k, 29 splits (232
// blocks in 264 slots) read 4% slower than 32 (256); benchmarks/HISTORY.md #2026-11-26-decode-waves).
constexpr double WAVE_EFFICIENCY_KEPT = 0.95;

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// num_splits where the caller gives none: the heuristic's where the kernel is chosen automatically,
// the call whole for a named configuration (which then runs as configured).
inline int default_num_splits(bool named) { return named ? 1 : 0; }

inline int num_splits_value(int64_t value) {
    if (value < 0 || value > std::numeric_limits<int>::max())
        throw py::value_error("num_splits: must be 0 (chosen by the heuristic) or a positive count, got " +
                              std::to_string(value));
    return static_cast<int>(value);
}

inline int num_splits_argument(py::handle value, bool named) {
    if (value.is_none())
        return default_num_splits(named);
    if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value))
        throw py::type_error("num_splits: expected an int, got " + type_name(value));
    return num_splits_value(value.cast<int64_t>());
}

// The number of splits that fills the GPU's waves (none below MIN_TILES_TO_SPLIT tiles): the wave
// efficiency of s splits is the share of the resident slots (BLOCKS_PER_SM per multiprocessor) its
// blocks fill, over all the waves they take; the heuristic takes the fewest splits within
// WAVE_EFFICIENCY_KEPT of the best, up to one per MIN_TILES_PER_SPLIT tiles and MAX_SPLITS (measured on the H200, benchmarks/HISTORY.md
// #2026-11-26-decode: 5 splits of 64 blocks, 1.2 waves, ran 30% slower than 4).
inline int heuristic_splits(int64_t query_blocks, int key_tiles, int multiprocessors) {
    if (key_tiles < MIN_TILES_TO_SPLIT)
        return 1;
    const int64_t slots = static_cast<int64_t>(BLOCKS_PER_SM) * multiprocessors;
    const int most = std::max(1, std::min(key_tiles / MIN_TILES_PER_SPLIT, MAX_SPLITS));
    const auto efficiency = [&](int splits) {
        const int64_t blocks = query_blocks * splits;
        return static_cast<double>(blocks) / static_cast<double>((blocks + slots - 1) / slots * slots);
    };
    double best = 0.0;
    for (int splits = 1; splits <= most; ++splits)
        best = std::max(best, efficiency(splits));
    for (int splits = 1; splits <= most; ++splits)
        if (efficiency(splits) >= WAVE_EFFICIENCY_KEPT * best)
            return splits;
    return 1;
}

// A splitting configuration's kernel for a call: its configuration, query rows per block, variant
// (a varlen one) and launcher, and the number of splits (1: the call runs whole).
struct SplitChoice {
    AnyConfig config;
    int block_rows;
    ProblemVariant variant;
    const ForwardLauncher *launcher;
    int num_splits;
};

// A configuration with this few query rows per block (DECODE_KERNELS') runs the calls whose
// sequences' queries fit one of its blocks even where the keys do not split: measured faster than
// the dispatch table's Hopper configurations there (H200, 32 x 4k and 128 x 2k,
// benchmarks/HISTORY.md #2026-11-26-decode-bandwidth), paged caches too.
constexpr int DECODE_BLOCK_ROWS = 64;

// The splits of a problem of query_blocks blocks over key_tiles tiles: `requested` (0: the
// heuristic's, where the multiprocessor count is known, else 1), capped at the key tiles and
// MAX_SPLITS.
inline int num_splits_for(int requested, int64_t query_blocks, int key_tiles, int multiprocessors) {
    if (requested > 0)
        return std::max(1, std::min({requested, key_tiles, MAX_SPLITS}));
    return multiprocessors > 0 ? heuristic_splits(query_blocks, key_tiles, multiprocessors) : 1;
}

// `cfg` (of a splitting family) on this problem: its varlen kernel and the splits num_splits_for
// gives (1: the call runs whole on that kernel); nullopt where the varlen variant is not compiled.
template <typename Family, typename Config>
std::optional<SplitChoice> split_with(const Config &cfg, const ForwardParams &params, const Problem &problem, int requested,
                                      int multiprocessors) {
    if constexpr (!Family::splits_keys) {
        return std::nullopt;
    } else {
        const ProblemVariant variant = Family::variant_for(cfg, params, problem, true);
        const ForwardLauncher *launcher = Family::find(cfg, variant);
        if (launcher == nullptr)
            return std::nullopt;
        const int key_tiles = ceil_div(params.seqlen_k, cfg.B_c);
        const int64_t query_blocks = static_cast<int64_t>(ceil_div(params.seqlen_q, cfg.B_r)) * params.heads_q * params.batch;
        return SplitChoice{cfg, cfg.B_r, variant, launcher, num_splits_for(requested, query_blocks, key_tiles, multiprocessors)};
    }
}

// The configurations that run decode-shaped calls of a dtype and head size on a GPU: the splitting
// families' configurations of that head size with a varlen kernel that fits the GPU, one per count
// of query rows per block (the largest key tiles of that count), fewest rows first. Looked up once
// per (dtype, d_head, GPU) and remembered: walking the registry on every call costs microseconds of
// a decode step's host time.
inline const std::vector<AnyConfig> &decoding_configs(DType dtype, int d_head, const Gpu &gpu) {
    using Key = std::tuple<DType, int, int, int64_t>;
    static std::mutex mutex;
    static std::map<Key, std::vector<AnyConfig>> found;
    const Key key{dtype, d_head, gpu.capability, gpu.smem_per_block};
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = found.find(key); it != found.end())
        return it->second;
    std::map<int, std::pair<int, AnyConfig>> by_rows; // B_r -> (B_c, configuration)
    for_each_family([&](auto family) {
        using Family = decltype(family);
        if constexpr (Family::splits_keys) {
            if (!Family::runs_on(gpu.capability))
                return;
            for (const auto &[kernel, launcher] : Family::kernels()) {
                const auto &[cfg, variant] = kernel;
                if (cfg.dtype != dtype || cfg.d_head != d_head || !variant.varlen || launcher.smem_bytes > gpu.smem_per_block)
                    continue;
                if (const auto it = by_rows.find(cfg.B_r); it == by_rows.end() || cfg.B_c > it->second.first)
                    by_rows.insert_or_assign(cfg.B_r, std::pair<int, AnyConfig>{cfg.B_c, cfg});
            }
        }
    });
    std::vector<AnyConfig> configs;
    for (const auto &[rows, entry] : by_rows)
        configs.push_back(entry.second);
    return found.emplace(key, std::move(configs)).first->second;
}

// For automatic configuration, a decode-shaped call (every sequence's queries fit one block of one
// of decoding_configs'): the one of fewest rows that holds them, on its varlen kernel, split as
// split_with says. It runs the call where the keys split, or where it has DECODE_BLOCK_ROWS rows or
// fewer; otherwise (nullopt) the dispatch table's configuration runs the call whole, as it does
// every longer one (its prefill is faster).
inline std::optional<SplitChoice> automatic_decode(DType dtype, int d_head, const ForwardParams &params,
                                                   const Problem &problem, const Gpu &gpu, int requested,
                                                   int multiprocessors) {
    for (const AnyConfig &config : decoding_configs(dtype, d_head, gpu)) {
        const std::optional<SplitChoice> choice = visit_config(config, [&](auto family, const auto &cfg) {
            using Family = decltype(family);
            return params.seqlen_q > cfg.B_r ? std::nullopt
                                             : split_with<Family>(cfg, params, problem, requested, multiprocessors);
        });
        if (!choice)
            continue;
        if (choice->num_splits == 1 && choice->block_rows > DECODE_BLOCK_ROWS)
            return std::nullopt;
        return choice;
    }
    return std::nullopt;
}

// Where a call's splits write: float32 partial outputs at o's strides and partial log-sum-exps at
// lse's layout, one of each per split, in one allocation (each costs microseconds of host time).
// Every split writes both for each row of its sequences, and the combine reads no other row, so
// neither is initialized.
struct SplitBuffers {
    at::Tensor partials;

    // Sets params.split (and lse's strides, which the partial log-sum-exps share) for o (batch
    // entries, ..., d_head) and lse (batch entries, heads, rows); packed (cu_seqlens): lse is
    // (heads, rows).
    SplitBuffers(int num_splits, const at::Tensor &o, int64_t rows, int64_t heads, bool packed, ForwardParams &params) {
        // A split's partial output spans o's elements, rounded up to whole float4s (the combine's
        // loads), so that the log-sum-exps after them stay aligned too.
        int64_t o_span = 1;
        for (int dim = 0; dim < o.dim(); ++dim)
            o_span += (o.size(dim) - 1) * o.stride(dim);
        o_span = (o_span + 3) / 4 * 4;
        const int64_t lse_span = o.size(0) * heads * rows;
        partials = at::empty({num_splits * (o_span + lse_span)}, o.options().dtype(at::kFloat));
        float *o_partial = partials.data_ptr<float>();
        params.lse_head_stride = rows;
        params.lse_batch_stride = packed ? 0 : heads * rows;
        params.split = SplitKV{num_splits, o_partial, o_partial + num_splits * o_span, o_span, lse_span};
    }
};

} // namespace flash::binding
