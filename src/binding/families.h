// Every kernel family of this build, and a configuration of any of them (AnyConfig). A new family
// adds its binding header here and its Family to the list.
#pragma once

#include <string>
#include <optional>
#include <tuple>
#include <type_traits>
#include <variant>

#include <pybind11/pybind11.h>

#include "binding/python_fields.h"
#include "sm80/binding.h"
#include "sm90/binding.h"

namespace flash::binding {

using Families = std::tuple<sm80::Family, sm90::Family>;
using AnyConfig = std::variant<sm80::Family::Config, sm90::Family::Config>;

// The family whose configuration type is Config.
template <typename Config, typename List = Families>
struct FamilyOfConfig;
template <typename Config, typename First, typename... Rest>
struct FamilyOfConfig<Config, std::tuple<First, Rest...>> {
    using type = std::conditional_t<std::is_same_v<typename First::Config, Config>, First,
                                    typename FamilyOfConfig<Config, std::tuple<Rest...>>::type>;
};
template <typename Config>
struct FamilyOfConfig<Config, std::tuple<>> {
    using type = void;
};

// visit(Family{}, config) for the family of `config`.
template <typename Visit>
decltype(auto) visit_config(const AnyConfig &config, Visit &&visit) {
    return std::visit(
        [&](const auto &cfg) -> decltype(auto) {
            return visit(typename FamilyOfConfig<std::decay_t<decltype(cfg)>>::type{}, cfg);
        },
        config);
}

// visit(Family{}) for every family, in the list's order.
template <typename Visit>
void for_each_family(Visit &&visit) {
    std::apply([&](auto... family) { (visit(family), ...); }, Families{});
}

inline std::string family_names() {
    std::string names;
    for_each_family([&](auto family) { names += (names.empty() ? "'" : ", '") + std::string(decltype(family)::name) + "'"; });
    return names;
}

// A configuration object of Python's (any object with a family name and the family's fields).
inline AnyConfig config_from_python(py::handle kernel_cfg) {
    if (!py::hasattr(kernel_cfg, "family") || !py::isinstance<py::str>(kernel_cfg.attr("family")))
        throw py::type_error("kernel_cfg: expected a kernel configuration (an object with a 'family' name), got " +
                             type_name(kernel_cfg));
    const std::string name = kernel_cfg.attr("family").cast<std::string>();
    std::optional<AnyConfig> config;
    for_each_family([&](auto family) {
        if (name == decltype(family)::name)
            config = decltype(family)::from_python(kernel_cfg);
    });
    if (!config)
        throw py::value_error("kernel_cfg: unknown kernel family '" + name + "'; this build has " + family_names());
    return *config;
}

// (family name, fields) of a configuration, as Python builds its configuration objects from.
inline py::tuple config_to_python(const AnyConfig &config) {
    return visit_config(config, [](auto family, const auto &cfg) {
        return py::make_tuple(decltype(family)::name, decltype(family)::to_python(cfg));
    });
}

} // namespace flash::binding
