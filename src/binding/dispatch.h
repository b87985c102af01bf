// Automatic configuration: which compiled kernel serves a problem when the call names no
// configuration. The dispatch tables (flash_helpers.dispatch_table: per architecture, the
// configurations ranked at each measured dtype, head size, mask and length, with their times) are
// handed over by Python once, at import; every call then chooses here, in C++.
//
// The rule: the entry measured at the problem's dtype, head size and mask kind (masked or not), at
// the smallest measured length >= seqlen_q (else the longest). Among its configurations that run
// on the GPU (its architecture, and its shared memory) and were compiled with the variant the
// problem needs, the one whose measured time, scaled by the tiles it visits at the problem's
// lengths against those at the measured length, is shortest (ties: the better place); with
// per-sequence lengths, the longest sequence's stand for the problem's. Where the table has no
// answer, the compiled configurations of the dtype and head size that have the variant: the default
// set's first, then the largest tiles, which load K and V least often per FLOP. The head size is
// the served one: the smallest compiled that holds the problem's (a head size between them runs
// with zero columns, binding/head_padding.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "binding/families.h"
#include "binding/problem.h"
#include "common/forward_params.h"
#include "common/launcher.h"
#include "common/problem_variant.h"

namespace flash::binding {

// How many (query block, key tile) pairs a kernel of B_r x B_c blocks computes for one (batch,
// head): what its time grows with. Mirrors the kernels' KVTileRange: a query block visits every
// tile that any of its B_r rows (those past seqlen_q included) may attend. `mask` holds the
// effective window sides (set_window's).
inline int64_t visited_tiles(int B_r, int B_c, int seqlen_q, int seqlen_k, const MaskParams &mask) {
    const int64_t key_tiles = (seqlen_k + B_c - 1) / B_c;
    const int64_t query_blocks = (seqlen_q + B_r - 1) / B_r;
    const bool left_bounded = mask.window_left != UNBOUNDED_WINDOW;
    const bool right_bounded = mask.window_right != UNBOUNDED_WINDOW;
    if (!left_bounded && !right_bounded)
        return query_blocks * key_tiles;
    const auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
    int64_t total = 0;
    for (int64_t block = 0; block < query_blocks; ++block) {
        const int64_t diagonal = block * B_r + seqlen_k - seqlen_q; // the block's first row's diagonal key
        const int64_t end = right_bounded ? std::min(key_tiles, std::max<int64_t>(0, floor_div(diagonal + mask.window_right + B_r - 1, B_c) + 1))
                                          : key_tiles;
        const int64_t begin = left_bounded ? std::max<int64_t>(0, floor_div(diagonal - mask.window_left, B_c)) : 0;
        total += std::max<int64_t>(0, end - begin);
    }
    return total;
}

struct RankedConfig {
    AnyConfig config;
    double time_ms;
};

struct TableEntry {
    DType dtype;
    int d_head;
    bool causal;
    int seq_len;
    std::vector<RankedConfig> ranked; // fastest first
};

// The dispatch tables by compute capability, and the default build set (the rule's first choice).
struct DispatchTables {
    std::map<int, std::vector<TableEntry>> entries;
    std::set<AnyConfig> defaults;

    static DispatchTables &instance() {
        static DispatchTables tables;
        return tables;
    }
};

// The GPU a choice is for: its compute capability (major * 10 + minor) and a block's opt-in dynamic
// shared memory.
struct Gpu {
    int capability;
    int64_t smem_per_block;
};

// Why the rule chose, where the table did not (DECODE: a decode-shaped call, on the splitting
// configuration split_kv.h's automatic_decode picks).
enum class RuleReason : int { NONE = 0, NO_TABLE = 1, NO_ENTRY = 2, NONE_COMPILED = 3, DECODE = 4 };

struct Choice {
    AnyConfig config;
    ProblemVariant variant;
    const ForwardLauncher *launcher;
    const TableEntry *entry; // the entry that ranked it, or null where the rule chose
    int place;               // in the entry, from 1
    RuleReason rule;
    bool is_default;
};

// Whether the automatic choice passes over `Family` for this call while another family runs it: a
// paged cache whose pages are shorter than the family reads fast (FamilyInfo::fast_page_size).
template <typename Family>
bool reads_pages_slowly(const ForwardParams &params) {
    const PagedKV &paged = params.sequences.paged;
    return paged.block_table != nullptr && paged.page_size < Family::fast_page_size;
}

// The launcher of `config` for this problem, with its variant, if it is compiled and runs on the GPU
// (and, with leave_slow_pages, its family does not read the call's pages slowly).
inline std::optional<std::pair<ProblemVariant, const ForwardLauncher *>>
runnable(const AnyConfig &config, const ForwardParams &params, const Problem &problem, const Gpu &gpu,
         bool leave_slow_pages) {
    return visit_config(config, [&](auto family, const auto &cfg) -> std::optional<std::pair<ProblemVariant, const ForwardLauncher *>> {
        using Family = decltype(family);
        if (!Family::runs_on(gpu.capability) || (leave_slow_pages && reads_pages_slowly<Family>(params)) ||
            Family::unserved_reason(cfg, params, problem) != nullptr)
            return std::nullopt;
        const ProblemVariant variant = Family::variant_for(cfg, params, problem, problem.varlen);
        const ForwardLauncher *launcher = Family::find(cfg, variant);
        if (launcher == nullptr || launcher->smem_bytes > gpu.smem_per_block)
            return std::nullopt;
        return std::pair{variant, launcher};
    });
}

inline std::pair<int, int> blocks_of(const AnyConfig &config) {
    return std::visit([](const auto &cfg) { return std::pair{cfg.B_r, cfg.B_c}; }, config);
}

inline const TableEntry *entry_for(const std::vector<TableEntry> &entries, DType dtype, int d_head, bool masked, int seqlen_q) {
    const TableEntry *chosen = nullptr;
    for (const TableEntry &e : entries) {
        if (e.dtype != dtype || e.d_head != d_head || e.causal != masked)
            continue;
        const bool covers = e.seq_len >= seqlen_q;
        const bool chosen_covers = chosen != nullptr && chosen->seq_len >= seqlen_q;
        // The smallest length that covers seqlen_q, else the longest.
        if (chosen == nullptr || (covers && (!chosen_covers || e.seq_len < chosen->seq_len)) ||
            (!covers && !chosen_covers && e.seq_len > chosen->seq_len))
            chosen = &e;
    }
    return chosen;
}

inline std::optional<Choice> choose_from_table(const TableEntry &entry, const ForwardParams &params, const Problem &problem,
                                               const Gpu &gpu, bool leave_slow_pages) {
    MaskParams measured_mask{};
    set_window(measured_mask, entry.causal, Window{-1, -1}, entry.seq_len, entry.seq_len);
    std::optional<Choice> best;
    double best_estimate = 0.0;
    for (size_t i = 0; i < entry.ranked.size(); ++i) {
        const auto &[config, time_ms] = entry.ranked[i];
        const auto found = runnable(config, params, problem, gpu, leave_slow_pages);
        if (!found)
            continue;
        const auto [B_r, B_c] = blocks_of(config);
        const double estimate = time_ms * visited_tiles(B_r, B_c, params.seqlen_q, params.seqlen_k, params.mask) /
                                visited_tiles(B_r, B_c, entry.seq_len, entry.seq_len, measured_mask);
        if (!best || estimate < best_estimate) {
            best_estimate = estimate;
            best = Choice{config, found->first, found->second, &entry, static_cast<int>(i) + 1, RuleReason::NONE, false};
        }
    }
    return best;
}

inline std::optional<Choice> choose_by_rule(DType dtype, int d_head, const ForwardParams &params, const Problem &problem,
                                            const Gpu &gpu, RuleReason why, bool leave_slow_pages) {
    const auto &defaults = DispatchTables::instance().defaults;
    std::optional<Choice> best;
    std::tuple<bool, int, AnyConfig> best_key{};
    for_each_family([&](auto family) {
        using Family = decltype(family);
        for (const auto &[key, launcher] : Family::kernels()) {
            const auto &[cfg, variant] = key;
            if (cfg.dtype != dtype || cfg.d_head != d_head)
                continue;
            const AnyConfig config = cfg;
            const auto found = runnable(config, params, problem, gpu, leave_slow_pages);
            if (!found)
                continue;
            const bool is_default = defaults.count(config) > 0;
            std::tuple<bool, int, AnyConfig> rank{!is_default, -cfg.B_r * cfg.B_c, config};
            if (!best || rank < best_key) {
                best_key = rank;
                best = Choice{config, found->first, found->second, nullptr, 0, why, is_default};
            }
        }
    });
    return best;
}

// The head size a problem of this d_head runs at: the smallest that a compiled configuration of its
// dtype has and this GPU runs, at least d_head (the kernels pad the columns past it with zeros).
// The registries are ordered by dtype, then d_head: each family's search starts at (dtype, d_head).
inline std::optional<int> served_d_head(DType dtype, int d_head, const Gpu &gpu) {
    std::optional<int> served;
    for_each_family([&](auto family) {
        using Family = decltype(family);
        if (!Family::runs_on(gpu.capability))
            return;
        typename Family::Config first{};
        first.dtype = dtype;
        first.d_head = d_head;
        const auto &kernels = Family::kernels();
        for (auto it = kernels.lower_bound({first, ProblemVariant{}}); it != kernels.end() && it->first.first.dtype == dtype;
             ++it)
            if (it->second.smem_bytes <= gpu.smem_per_block) {
                if (!served || it->first.first.d_head < *served)
                    served = it->first.first.d_head;
                break;
            }
    });
    return served;
}

// The kernel of the served head size for a problem: the table's, else the rule's.
inline std::optional<Choice> choose_at(DType dtype, int d_head, const ForwardParams &params, const Problem &problem,
                                       const Gpu &gpu, bool leave_slow_pages) {
    const auto &tables = DispatchTables::instance().entries;
    const auto table = tables.find(gpu.capability);
    RuleReason why = RuleReason::NO_TABLE;
    if (table != tables.end()) {
        const TableEntry *entry = entry_for(table->second, dtype, d_head, problem.mask != MaskKind::NONE, params.seqlen_q);
        why = RuleReason::NO_ENTRY;
        if (entry != nullptr) {
            if (auto choice = choose_from_table(*entry, params, problem, gpu, leave_slow_pages))
                return choice;
            why = RuleReason::NONE_COMPILED;
        }
    }
    return choose_by_rule(dtype, d_head, params, problem, gpu, why, leave_slow_pages);
}

// The kernel for a problem, or nullopt where this build has none that runs it on this GPU: the
// configurations of the served head size (served_d_head), those of a family that reads the call's
// pages slowly only where no other family's runs it.
inline std::optional<Choice> choose(DType dtype, const ForwardParams &params, const Problem &problem, const Gpu &gpu) {
    const std::optional<int> d_head = served_d_head(dtype, params.d_head, gpu);
    if (!d_head)
        return std::nullopt;
    if (auto choice = choose_at(dtype, *d_head, params, problem, gpu, true))
        return choice;
    return choose_at(dtype, *d_head, params, problem, gpu, false);
}

} // namespace flash::binding
