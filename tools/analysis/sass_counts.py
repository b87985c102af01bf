#!/usr/bin/env python3
"""Counts the SASS instructions of each compiled forward-kernel configuration.

Runs `cuobjdump --dump-sass` on the built extension (flash_attention._C), splits the listing into
kernels, maps each kernel's symbol to its configuration, of either family (SM80 or Hopper), and
problem variant (a configuration is compiled once per variant it serves: mask kind none, causal or
local; masked tails, for lengths that are not multiples of the block sizes; score mods, for softcap
and ALiBi), and counts instructions by opcode (with its modifiers, e.g. HMMA.16816.F32,
LDSM.16.M88.4, LDGSTS.E.BYPASS.128, HGMMA.64x128x16.F32; predicates such as @P0 are dropped) and by
opcode family (the part before the first '.'). The extension holds code for each architecture it
was built for (sm_80, and sm_90a for 9.0, which --arch sm_90 also names): each is reported on its
own.

Variants are named by their mask kind, then +tails and +mods: none, causal, causal+tails,
local+tails+mods, ... By default only each configuration's 'none' kernel (no mask, whole blocks:
the one the benchmarks time) is shown; --variants all shows every one.

Prints, per architecture, one row per kernel with the families that matter to these kernels:
tensor-core MMAs (HMMA), shared-memory matrix loads (LDSM), asynchronous copies (LDGSTS), global
and shared loads and stores, the softmax's floating-point work (FFMA, FMUL, FADD, FMNMX, MUFU),
warp shuffles (SHFL), barriers (BAR) and register spills to local memory (LDL, STL); and, in a
table with a kernel that has them, the Hopper family's: warpgroup MMAs (HGMMA, from wgmma, and
QGMMA, its e4m3 form), their fences and waits (WARPGROUP), TMA loads and stores (UTMALDG, UTMASTG)
and mbarrier operations (SYNCS). These are static counts: an instruction inside a loop counts once.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.machinery
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmark"))
import bench_common as common  # noqa: E402  (also makes flash_helpers importable from a bare checkout)
from flash_helpers.kernel_config import KernelConfig  # noqa: E402
from flash_helpers.kernel_names import parse_kernel_name_into_config  # noqa: E402
from flash_helpers.kernel_sets import get_kernel_configs  # noqa: E402
from flash_helpers.problem import ALL_VARIANTS, KV_E4M3_VARIANTS, VARLEN_VARIANTS, ProblemVariant  # noqa: E402
from flash_helpers.tuning_space import get_all_kernel_configs  # noqa: E402

# The families shown in the tables, in column order; "total" is every instruction but padding.
FAMILIES = (
    "HMMA", "HGMMA", "QGMMA", "WARPGROUP", "LDSM", "LDGSTS", "UTMALDG", "UTMASTG", "SYNCS", "LDG", "STG", "LDS", "STS",
    "FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "SHFL", "BAR", "LDL", "STL",
)  # fmt: skip
# sm_90 instructions only the Hopper family's kernels use: a table shows them only where one of its
# kernels has them, so tables of SM80 kernels stay narrow. The others are always shown: a zero there
# says something (no spills, no asynchronous copies).
WHERE_USED_FAMILIES = frozenset({"HGMMA", "QGMMA", "WARPGROUP", "UTMALDG", "UTMASTG", "SYNCS"})
TOTAL = "total"
# The NOPs after a kernel's final branch only pad it to an alignment boundary; they are counted by
# opcode but left out of the total so that totals compare the code that runs.
PADDING_OPCODE = "NOP"

_ARCH_RE = re.compile(r"^\s*(?:arch\s*=|code for)\s*(sm_\d+\w*)")
_FUNCTION_RE = re.compile(r"^\s*Function\s*:\s*(\S+)")
# An instruction line: /*0a40*/ (its offset), an optional predicate (@P0, @!PT, @!UP1), the opcode
# with its modifiers (HGMMA's shape is lower case: HGMMA.64x128x16.F32), then operands up to ';'.
# Older listings wrap dual-issued pairs in braces.
_INSTRUCTION_RE = re.compile(
    r"^\s*/\*([0-9a-fA-F]+)\*/\s*\{?\s*(?:(@!?U?P[T\d]+)\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)([^;]*)"
)
# Trailing zero-valued fields of the configuration in a kernel's symbol: their mangling differs
# between compilers (nvcc's device symbols keep them; host compilers omit them).
_TRAILING_ZERO_FIELDS_RE = re.compile(r"(?:L[bi]0E)+(?=E)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction of a listing: its offset, predicate ('' if none), opcode and operands."""

    offset: int
    predicate: str
    opcode: str
    operands: str


@dataclasses.dataclass
class SassFunction:
    """One kernel's code for one architecture: its symbol, its instruction counts by opcode and, if
    kept, its instructions in program order."""

    arch: str
    symbol: str
    opcodes: collections.Counter
    instructions: list[Instruction] = dataclasses.field(default_factory=list)


def parse_sass(text: str, keep_instructions: bool = False) -> list[SassFunction]:
    """The kernels in a `cuobjdump --dump-sass` listing, in listing order; with keep_instructions
    each holds its instructions too (a whole build's are millions: only the tools that read them
    keep them)."""
    functions = []
    arch, current = "unknown", None
    for line in text.splitlines():
        arch_match = _ARCH_RE.match(line)
        if arch_match:
            arch, current = arch_match[1], None
            continue
        function_match = _FUNCTION_RE.match(line)
        if function_match:
            current = SassFunction(arch, function_match[1], collections.Counter())
            functions.append(current)
            continue
        instruction = _INSTRUCTION_RE.match(line)
        if instruction and current is not None:
            offset, predicate, opcode, operands = instruction.groups()
            current.opcodes[opcode] += 1
            if keep_instructions:
                current.instructions.append(Instruction(int(offset, 16), predicate or "", opcode, operands.strip()))
    return functions


def opcode_family(opcode: str) -> str:
    return opcode.split(".", 1)[0]


def family_counts(opcodes: collections.Counter) -> collections.Counter:
    """Counts by family, plus the total of all instructions but padding under TOTAL."""
    families = collections.Counter()
    for opcode, count in opcodes.items():
        families[opcode_family(opcode)] += count
    families[TOTAL] = sum(families.values()) - families[PADDING_OPCODE]
    return families


def arch_matches(arch: str, wanted: str | None) -> bool:
    """Whether a listing's architecture ``arch`` is the one ``wanted`` names (None: any). A build
    for 9.0 holds sm_90a code (arch-specific, which the Hopper family needs): sm_90 names it too."""
    return wanted is None or wanted in (arch, arch.removesuffix("a"))


def canonical_symbol(symbol: str) -> str:
    return _TRAILING_ZERO_FIELDS_RE.sub("", symbol)


def variant_name(variant: ProblemVariant) -> str:
    """The variant as the tables print it and --variants takes it: the mask kind, then +tails,
    +mods, +varlen and +kv_e4m3 where on, e.g. none, causal+tails, local+tails+mods."""
    flags = [name for name, on in zip(("tails", "mods", "varlen", "kv_e4m3"), variant.flags()) if on]
    return "+".join([variant.mask.name.lower(), *flags])


VARIANTS_BY_NAME = {variant_name(variant): variant for variant in ALL_VARIANTS + VARLEN_VARIANTS + KV_E4M3_VARIANTS}
# The variant shown by default: no mask, whole blocks, the kernel the benchmarks time.
DEFAULT_VARIANT = variant_name(ProblemVariant())


class KernelSymbols:
    """Maps kernel symbols to (configuration, problem variant), from ``mangled_kernel_name(variant)``.

    A symbol is the configuration's part followed by the variant's, and within a family a
    variant's part is the same whatever the configuration (each family has its own kernel and
    parameter type, so its own suffixes), so one symbol per configuration and one suffix per
    family and variant cover every pair without listing them all (every valid configuration times
    nine variants). By default every valid configuration of every family is a candidate: the build
    compiles only valid ones, so this covers whatever the extension holds without importing it (or
    torch).
    """

    def __init__(self, candidates: list[KernelConfig] | None = None):
        configs = get_all_kernel_configs() if candidates is None else candidates
        self._variant_by_suffix: dict[str, ProblemVariant] = {}
        suffix_lengths: dict[type, int] = {}
        for cfg in configs:
            if type(cfg) in suffix_lengths:
                continue
            names = {variant: cfg.mangled_kernel_name(variant) for variant in ALL_VARIANTS + VARLEN_VARIANTS + KV_E4M3_VARIANTS}
            shared = len(os.path.commonprefix(list(names.values())))
            self._variant_by_suffix.update({name[shared:]: variant for variant, name in names.items()})
            suffix_lengths[type(cfg)] = len(names[ProblemVariant()]) - shared
        self._config_by_head = {
            canonical_symbol(cfg.mangled_kernel_name()[: -suffix_lengths[type(cfg)]]): cfg for cfg in configs
        }

    def lookup(self, symbol: str) -> tuple[KernelConfig, ProblemVariant] | None:
        """The configuration and variant of a kernel's symbol, or None for another function."""
        for suffix, variant in self._variant_by_suffix.items():
            if symbol.endswith(suffix):
                cfg = self._config_by_head.get(canonical_symbol(symbol[: -len(suffix)]))
                if cfg is not None:
                    return cfg, variant
        return None


@dataclasses.dataclass
class KernelCounts:
    """One kernel's instruction counts for one architecture: a configuration in one problem variant."""

    arch: str
    config: KernelConfig
    variant: ProblemVariant
    symbol: str
    opcodes: collections.Counter
    instructions: list[Instruction] = dataclasses.field(default_factory=list)

    @property
    def families(self) -> collections.Counter:
        return family_counts(self.opcodes)


def map_to_configs(
    functions: list[SassFunction], symbols: KernelSymbols | None = None
) -> tuple[list[KernelCounts], list[SassFunction]]:
    """The functions that are forward kernels (sorted by architecture, configuration and variant),
    and the others."""
    symbols = KernelSymbols() if symbols is None else symbols
    kernels, others = [], []
    for function in functions:
        found = symbols.lookup(function.symbol)
        if found is None:
            others.append(function)
        else:
            kernels.append(
                KernelCounts(function.arch, *found, function.symbol, function.opcodes, function.instructions)
            )
    kernels.sort(key=lambda kernel: (kernel.arch, kernel.config, kernel.variant))
    return kernels, others


def parse_config(text: str) -> KernelConfig:
    """A configuration of any family, from its short form or a kernel name (an argparse type)."""
    try:
        return parse_kernel_name_into_config(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def kernels_of_variant(
    kernels: list[KernelCounts], variant: ProblemVariant, arch: str | None
) -> dict[str, dict[KernelConfig, KernelCounts]]:
    """The kernels of one problem variant, by architecture (those ``arch`` names) and configuration."""
    by_arch = collections.defaultdict(dict)
    for kernel in kernels:
        if arch_matches(kernel.arch, arch) and kernel.variant == variant:
            by_arch[kernel.arch][kernel.config] = kernel
    return dict(sorted(by_arch.items()))


def add_variant_argument(parser: argparse.ArgumentParser, shown: str) -> None:
    """--variant, the problem variant whose kernels a tool shows (shared with sass_diff.py and sass_order.py)."""
    parser.add_argument(
        "--variant",
        choices=VARIANTS_BY_NAME,
        default=DEFAULT_VARIANT,
        help=f"the problem variant whose {shown} (default: %(default)s)",
    )


def load_variant_kernels(
    args: argparse.Namespace, keep_instructions: bool = False
) -> dict[str, dict[KernelConfig, KernelCounts]]:
    """The kernels of args.variant by architecture and configuration, from the listing --module or
    --sass-file names, at --arch; raises SassError or OSError where there is no listing."""
    kernels, _ = load_kernels(args.module, args.sass_file, keep_instructions)
    return kernels_of_variant(kernels, VARIANTS_BY_NAME[args.variant], args.arch)


def not_held_message(
    wanted: list[KernelConfig], by_arch: dict[str, dict[KernelConfig, KernelCounts]], variant: str, arch: str | None
) -> str:
    """Why a tool found none of the kernels it was asked for: what is missing, and what the extension holds."""
    present = sorted({cfg for at_arch in by_arch.values() for cfg in at_arch})
    missing = [cfg.short_form() for cfg in wanted if cfg not in present]
    return (
        f"error: the extension does not hold {'both configurations' if len(wanted) > 1 else 'the configuration'} "
        f"in variant {variant}"
        + (f" for {arch}" if arch else "")
        + (f"; missing: {'; '.join(missing)}" if missing else "")
        + "\nconfigurations it holds:\n  "
        + "\n  ".join(cfg.short_form() for cfg in present)
    )


# ----------------------------------------------------------------------------------------------
# Getting the listing


class SassError(RuntimeError):
    """The SASS listing could not be produced."""


def default_module() -> pathlib.Path:
    """flash_attention._C's file, found without importing the package (whose import needs torch)."""
    spec = importlib.util.find_spec("flash_attention")
    locations = list(spec.submodule_search_locations or []) if spec else []
    locations.append(str(common.REPO_ROOT / "py" / "flash_attention"))
    for location in locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = pathlib.Path(location, "_C" + suffix)
            if path.is_file():
                return path
    raise SassError(
        "flash_attention._C is not built (build it with pip install --no-build-isolation -e .), or pass --module PATH"
    )


CUOBJDUMP_WHEEL = "nvidia-cuda-cuobjdump"


def toolkit_roots() -> list[str]:
    """Where a CUDA toolkit may be installed: CUDA_HOME, CUDA_PATH, /usr/local/cuda."""
    return [root for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if root]


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, else in the CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda), else from
    NVIDIA's wheel (pip install nvidia-cuda-cuobjdump: it needs neither the toolkit nor a GPU, and
    installs under the nvidia namespace package, e.g. nvidia/cu13/bin/cuobjdump)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for root in toolkit_roots():
        if (candidate := pathlib.Path(root, "bin", "cuobjdump")).is_file():
            return str(candidate)
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(pathlib.Path(root).glob("*/bin/cuobjdump")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def read_sass(module: str | None, sass_file: str | None) -> str:
    """The SASS listing: read from ``sass_file``, else dumped from ``module`` (default: the built
    extension) with cuobjdump."""
    if sass_file:
        return pathlib.Path(sass_file).read_text()
    path = pathlib.Path(module) if module else default_module()
    if not path.is_file():
        raise SassError(f"{path}: no such file")
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        raise SassError(
            "cuobjdump was not found on PATH, under CUDA_HOME nor in NVIDIA's wheel; install the CUDA toolkit or "
            f"`pip install {CUOBJDUMP_WHEEL}`, or pass --sass-file with a listing saved by `cuobjdump --dump-sass`"
        )
    result = subprocess.run([cuobjdump, "--dump-sass", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise SassError(f"cuobjdump --dump-sass {path} failed (status {result.returncode}):\n{result.stderr.strip()}")
    return result.stdout


def load_kernels(
    module: str | None, sass_file: str | None, keep_instructions: bool = False
) -> tuple[list[KernelCounts], list[SassFunction]]:
    text = read_sass(module, sass_file)
    functions = parse_sass(text, keep_instructions)
    if not functions:
        raise SassError("the listing holds no kernel code (was the extension built for a real architecture?)")
    return map_to_configs(functions)


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say where the SASS comes from (shared with sass_diff.py)."""
    parser.add_argument("--module", metavar="PATH", help="the extension to disassemble (default: flash_attention._C)")
    parser.add_argument(
        "--sass-file", metavar="PATH", help="read a listing saved by `cuobjdump --dump-sass` instead of running it"
    )
    parser.add_argument(
        "--arch", help="only this architecture, e.g. sm_90 (or sm_90a) (default: every one in the extension)"
    )


# ----------------------------------------------------------------------------------------------
# Reports


def shown_families(kernels: list[KernelCounts]) -> list[str]:
    """The families a table of ``kernels`` shows, in column order: FAMILIES, less those of
    WHERE_USED_FAMILIES that none of the kernels has."""
    return [
        family
        for family in FAMILIES
        if family not in WHERE_USED_FAMILIES or any(kernel.families[family] for kernel in kernels)
    ]


def format_family_table(kernels: list[KernelCounts]) -> str:
    columns = [*shown_families(kernels), TOTAL]
    rows = [
        [kernel.config.short_form(), variant_name(kernel.variant), *(kernel.families[f] for f in columns)]
        for kernel in kernels
    ]
    return common.format_table(["config", "variant", *columns], rows)


def format_opcode_table(kernel: KernelCounts) -> str:
    rows = [[opcode, count] for opcode, count in sorted(kernel.opcodes.items(), key=lambda item: (-item[1], item[0]))]
    return common.format_table(["opcode", "count"], rows)


def csv_rows(kernels: list[KernelCounts]) -> list[dict]:
    return [
        {
            "arch": kernel.arch,
            "config": kernel.config.short_form(),
            "variant": variant_name(kernel.variant),
            "opcode": opcode,
            "family": opcode_family(opcode),
            "count": count,
        }
        for kernel in kernels
        for opcode, count in sorted(kernel.opcodes.items())
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_arguments(parser)
    parser.add_argument(
        "--kernels",
        help="only these configurations: short forms separated by ';', or a set name (prog, progall, tune, all, "
        "'B_r,B_c'); default: every configuration in the extension",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=["all", *VARIANTS_BY_NAME],
        default=[DEFAULT_VARIANT],
        metavar="VARIANT",
        help=f"only these problem variants ({', '.join(VARIANTS_BY_NAME)}), or all (default: {DEFAULT_VARIANT})",
    )
    parser.add_argument("--opcodes", action="store_true", help="also print each kernel's counts by opcode")
    parser.add_argument(
        "--csv", metavar="PATH", help="also write the counts by opcode (arch, config, variant, opcode) to PATH"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        kernels, others = load_kernels(args.module, args.sass_file)
        selected = set(get_kernel_configs(args.kernels)) if args.kernels else None
    except (SassError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    variants = None if "all" in args.variants else {VARIANTS_BY_NAME[name] for name in args.variants}
    kernels = [
        kernel
        for kernel in kernels
        if (selected is None or kernel.config in selected)
        and arch_matches(kernel.arch, args.arch)
        and (variants is None or kernel.variant in variants)
    ]
    if others:
        print(f"note: {len(others)} kernel(s) are not forward kernels and are left out", file=sys.stderr)
    if not kernels:
        print("error: no forward kernel matches", file=sys.stderr)
        return 1

    for arch in sorted({kernel.arch for kernel in kernels}):
        at_arch = [kernel for kernel in kernels if kernel.arch == arch]
        print(f"{arch}: instructions per family ({len(at_arch)} kernels)")
        print(format_family_table(at_arch))
        print()
        if args.opcodes:
            for kernel in at_arch:
                print(f"{arch}: {kernel.config.short_form()}, {variant_name(kernel.variant)}")
                print(format_opcode_table(kernel))
                print()
    if args.csv:
        common.write_csv(args.csv, csv_rows(kernels), ["arch", "config", "variant", "opcode", "family", "count"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
