"""CPU tests of the kernel families' configuration types, their textual forms, their validity rules
and the sets, which span the families."""

import dataclasses
import itertools
import os
import pathlib
import random
import subprocess
import sys

import pytest

from flash_helpers import sm90_config
from flash_helpers.build_env import (
    ARCH_LIST_ENV,
    BUILD_KERNELS_ENV,
    DEFAULT_ARCH_LIST,
    PTX_ONLY_ENV,
    REBUILD_HINT,
    arch_list_for_build,
    ptx_only_gencode_flags,
    resolve_arch_list,
    sm90_in_arch_list,
)
from flash_helpers.default_set import DECODE_KERNELS, DEFAULT_BUILD_KERNELS, VARLEN_KERNELS
from flash_helpers.dtypes import DTYPES, FP8_DTYPES, DType, output_dtype
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.kernel_sets import KERNELS_ENV, get_kernel_configs, get_kernels_to_build, variants_to_build
from flash_helpers.problem import MaskKind, ProblemVariant, attention_flop, needed_variant, total_flop
from flash_helpers.progression_steps import (
    SM80_PROGRESSION_BLOCK,
    SM80_PROGRESSION_STEPS,
    SM90_PROGRESSION_BLOCK,
    SM90_PROGRESSION_STEPS,
    get_kernel_progression_configs,
)
from flash_helpers.sm80_config import B_CS, B_RS, D_HEADS, MAX_SMEM_BYTES, N_WARPS, FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig
from flash_helpers.tuning_space import get_all_kernel_configs, get_autotuning_kernel_configs, should_autotune_config

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
FP16, BF16, E4M3 = DType.FP16, DType.BF16, DType.E4M3
Config = FlashForwardKernelConfig
Hopper = HopperForwardKernelConfig

# Which configuration field each short-form flag of a progression step turns on.
STEP_FLAG_KNOBS = {
    "async": "async_copy",
    "eager": "eager_load_blocks",
    "swizzled": "swizzled",
    "buffer": "mma_double_buffer_loads",
    "opt_softmax": "optimized_softmax",
}


@pytest.fixture(autouse=True)
def _no_kernel_env(monkeypatch):
    """The sets read environment variables; tests start from an environment without them."""
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    monkeypatch.delenv(BUILD_KERNELS_ENV, raising=False)
    monkeypatch.delenv(ARCH_LIST_ENV, raising=False)


def of_family(configs, cls):
    return [cfg for cfg in configs if isinstance(cfg, cls)]


def config_sets():
    return {
        "all": get_kernel_configs("all"),
        "tune": get_kernel_configs("tune"),
        "prog": get_kernel_configs("prog"),
        "progall": get_kernel_configs("progall"),
        "default": get_kernels_to_build("default"),
        "128,64": get_kernel_configs("128,64"),
    }


SET_NAMES = list(config_sets())


def valid_block_sizes():
    """(d_head, B_r, B_c, n_warps) combinations the rules accept, judged on the plain base config and
    on the eager one (whose second stage gives the key groups' merge the shared memory it needs)."""
    return {
        (d_head, B_r, B_c, n_warps)
        for d_head in D_HEADS
        for B_r in B_RS
        for B_c in B_CS
        for n_warps in N_WARPS
        if Config(FP16, d_head, B_r, B_c, n_warps).is_valid()
        or Config(FP16, d_head, B_r, B_c, n_warps, True, True).is_valid()
    }


# ----------------------------------------------------------------------------------------------
# Textual forms


@pytest.mark.parametrize("set_name", SET_NAMES)
def test_every_config_round_trips_through_its_textual_forms(set_name):
    configs = config_sets()[set_name]
    assert configs
    for cfg in configs:
        for text in (cfg.short_form(), cfg.demangled_kernel_name(), cfg.to_cpp_struct()):
            assert parse_kernel_name_into_config(text) == cfg, text


def test_short_form_lists_flags_in_fixed_order():
    cfg = Config(FP16, 128, 128, 64, 4, True, True, True, 2, 2, 2, True, True)
    assert cfg.short_form() == "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_2_2_2_tiles+buffer+opt_softmax"


def test_short_form_without_flags_is_the_tuple():
    assert Config(BF16, 64, 64, 32, 4).short_form() == "(BF16, 64, 64, 32, 4)"


def test_short_form_load_flag_present_iff_any_tile_count_is_nonzero():
    assert Config(FP16, 128, 64, 64, 4, V_mma_load_K_tiles=2).short_form() == "(FP16, 128, 64, 64, 4): load_0_0_2_tiles"
    assert "load" not in Config(FP16, 128, 64, 64, 4, async_copy=True).short_form()


def test_cpp_struct():
    cfg = Config(FP16, 128, 64, 64, 4, True, K_mma_load_K_tiles=2, V_mma_load_K_tiles=2)
    struct = "FlashForwardKernelConfig{DType::FP16, 128, 64, 64, 4, true, false, false, 0, 2, 2, false, false}"
    assert cfg.to_cpp_struct() == struct


@pytest.mark.parametrize(
    ("cfg", "initializer"),
    [
        (
            Config(FP16, 128, 64, 64, 4, True, K_mma_load_K_tiles=2, V_mma_load_K_tiles=2),
            "{(flash::DType)5, 128, 64, 64, 4, true, false, false, 0, 2, 2}",
        ),
        (Config(FP16, 128, 64, 64, 4), "{(flash::DType)5, 128, 64, 64, 4}"),
        (Config(BF16, 64, 64, 32, 4, True), "{(flash::DType)15, 64, 64, 32, 4, true}"),
        (
            Config(FP16, 128, 128, 64, 4, False, optimized_softmax=True),
            "{(flash::DType)5, 128, 128, 64, 4, false, false, false, 0, 0, 0, false, true}",
        ),
    ],
    ids=lambda value: value.short_form() if isinstance(value, Config) else "",
)
def test_host_stub_names_without_trailing_zero_fields_parse(cfg, initializer):
    """The host stub's symbol (nm, c++filt) leaves out trailing zero-valued fields."""
    host_name = (
        "void flash::flash_forward_kernel<flash::StaticForwardKernelConfig<"
        f"flash::FlashForwardKernelConfig{initializer}> >(flash::ForwardKernelArgs)"
    )
    assert parse_kernel_name_into_config(host_name) == cfg


def test_file_stem_example_and_uniqueness():
    cfg = Config(FP16, 128, 64, 64, 4, True, K_mma_load_K_tiles=2, V_mma_load_K_tiles=2)
    assert cfg.file_stem() == "fp16_d128_br64_bc64_w4_async_load_0_2_2"
    configs = get_all_kernel_configs()
    stems = {cfg.file_stem() for cfg in configs}
    assert len(stems) == len(configs)
    assert all(stem.replace("_", "").isalnum() and stem.islower() for stem in stems)


# ----------------------------------------------------------------------------------------------
# Parsing


def test_parse_seed_documented_form():
    cfg = parse_kernel_name_into_config("FlashForwardKernelConfig{5, 128, 64, 64, 4, 1, 1, 1, 0, 2, 0, 1, 1}")
    assert cfg == Config(FP16, 128, 64, 64, 4, True, True, True, 0, 2, 0, True, True)
    assert isinstance(cfg.dtype, DType)
    assert cfg.async_copy is True and cfg.Q_mma_load_K_tiles == 0


def test_parse_cxxfilt_output_with_trailing_fields_omitted():
    name = (
        "void flash::flash_forward_kernel<flash::StaticForwardKernelConfig<flash::FlashForwardKernelConfig"
        "{(flash::DType)5, 128, 64, 64, 4, true, false, false, 0, 2, 2}> >(flash::ForwardKernelArgs)"
    )
    cfg = parse_kernel_name_into_config(name)
    assert cfg == Config(FP16, 128, 64, 64, 4, True, False, False, 0, 2, 2, False, False)
    assert cfg.mma_double_buffer_loads is False and cfg.optimized_softmax is False


@pytest.mark.parametrize(
    "text",
    [
        "(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles",
        "(FP16, 128, 64, 64, 4):async+load_0_2_2_tiles",
        "  (fp16,128,64,64,4) : load_0_2_2_tiles + async \n",
        "flash_forward_kernel<StaticForwardKernelConfig<"
        "FlashForwardKernelConfig{(DType)5, 128, 64, 64, 4, true, false, false, 0, 2, 2}>>",
        "FlashForwardKernelConfig{5, (int)128, 64, 64, 4, (bool)1, 0, false, 0, 2, 2}",
        "FlashForwardKernelConfig{flash::DType::FP16, 128, 64, 64, 4, true, false, false, 0, 2, 2, false, false}",
    ],
)
def test_parse_accepts_the_spellings_people_and_tools_use(text):
    expected = Config(FP16, 128, 64, 64, 4, True, K_mma_load_K_tiles=2, V_mma_load_K_tiles=2)
    assert parse_kernel_name_into_config(text) == expected


def test_parse_short_form_without_flags():
    assert parse_kernel_name_into_config("(BF16, 64, 128, 32, 8)") == Config(BF16, 64, 128, 32, 8)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "fast kernel",
        "(FP16, 128, 64, 64)",
        "(FP32, 128, 64, 64, 4)",
        "(FP16, 128, 64, 64, 4):",
        "(FP16, 128, 64, 64, 4): turbo",
        "(FP16, 128, 64, 64, 4): async+async",
        "(FP16, 128, 64, 64, 4): async++eager",
        "(FP16, 128, 64, 64, 4): load_0_2_2_tiles+load_2_2_2_tiles",
        "FlashForwardKernelConfig{}",
        "FlashForwardKernelConfig{7, 128, 64, 64, 4}",
        "FlashForwardKernelConfig{5, 128, 64, 64, 4, 2}",
        "FlashForwardKernelConfig{5, true, 64, 64, 4}",
        "FlashForwardKernelConfig{5, 128, 64, DType::FP16, 4}",
        "FlashForwardKernelConfig{5, 128, 64, 64, 4, yes}",
        "FlashForwardKernelConfig{5, 128, 64, 64, 4, 1, 0, 0, 0, 2, 2, 0, 0, 0}",
    ],
)
def test_parse_errors_are_value_errors_quoting_the_name(name):
    with pytest.raises(ValueError) as error:
        parse_kernel_name_into_config(name)
    assert repr(name) in str(error.value)


# ----------------------------------------------------------------------------------------------
# Construction, ordering, hashing


def test_knobs_default_to_off():
    cfg = Config(FP16, 128, 64, 64, 4)
    assert not any(dataclasses.astuple(cfg)[5:])


def test_dtype_is_coerced_from_code_and_name():
    by_code = Config(15, 128, 64, 64, 4)
    by_name = Config("bfloat16", 128, 64, 64, 4)
    assert by_code.dtype is DType.BF16 and by_name.dtype is DType.BF16
    assert by_code == by_name == Config(BF16, 128, 64, 64, 4)
    assert hash(by_code) == hash(Config(BF16, 128, 64, 64, 4))


@pytest.mark.parametrize(
    ("fields", "error", "field_name"),
    [
        ({"dtype": None}, TypeError, "dtype"),
        ({"dtype": True}, TypeError, "dtype"),
        ({"dtype": 5.0}, TypeError, "dtype"),
        ({"dtype": 6}, ValueError, "dtype"),
        ({"dtype": "fp32"}, ValueError, "dtype"),
        ({"d_head": 128.0}, TypeError, "d_head"),
        ({"d_head": True}, TypeError, "d_head"),
        ({"B_r": "64"}, TypeError, "B_r"),
        ({"K_mma_load_K_tiles": None}, TypeError, "K_mma_load_K_tiles"),
        ({"async_copy": 1}, TypeError, "async_copy"),
        ({"optimized_softmax": "true"}, TypeError, "optimized_softmax"),
    ],
)
def test_construction_checks_types(fields, error, field_name):
    arguments = {"dtype": FP16, "d_head": 128, "B_r": 64, "B_c": 64, "n_warps": 4, **fields}
    with pytest.raises(error, match=field_name):
        Config(**arguments)


def test_construction_does_not_check_validity():
    assert not Config(FP16, 80, 64, 64, 4).is_valid()


@pytest.mark.parametrize(
    "short_form",
    [
        "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax",
        "sm90(BF16, 128, 128, 128, 2): ws+pingpong+overlap+persistent",
    ],
)
def test_construction_traces_inside_a_compiled_function(short_form):
    """A model may build a configuration inside torch.compile(fullgraph=True); tracing runs the
    construction checks, with their per-class table empty (the first construction fills it while
    traced) and then filled."""
    torch = pytest.importorskip("torch")
    from flash_helpers import kernel_config

    def scale_by_head(x):
        return x * parse_kernel_name_into_config(short_form).d_head

    for table in ("empty", "filled"):
        torch._dynamo.reset()
        if table == "empty":
            kernel_config._TYPED_FIELDS.clear()
        compiled = torch.compile(scale_by_head, fullgraph=True)
        assert torch.equal(compiled(torch.ones(2)), scale_by_head(torch.ones(2))), table


def test_configs_are_immutable():
    cfg = Config(FP16, 128, 64, 64, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_head = 64


def test_ordering_is_family_then_field_tuple_ordering():
    configs = get_all_kernel_configs()
    shuffled = configs[:]
    random.Random(0).shuffle(shuffled)
    key = lambda cfg: (cfg.family, *(int(value) for value in dataclasses.astuple(cfg)))  # noqa: E731
    assert sorted(shuffled) == sorted(shuffled, key=key)
    assert Config(BF16, 256, 128, 128, 8) < Hopper(FP16, 64, 64, 64, 1)  # the family decides first
    assert Hopper(FP16, 64, 64, 64, 1) > Config(BF16, 256, 128, 128, 8) >= Config(BF16, 256, 128, 128, 8)
    assert Config(FP16, 128, 64, 64, 4) < Config(BF16, 64, 64, 64, 4)  # dtype code 5 < 15 decides first
    assert Config(FP16, 64, 128, 64, 4) < Config(FP16, 128, 64, 64, 4)  # then d_head, before B_r
    assert Config(FP16, 128, 64, 64, 4, False) < Config(FP16, 128, 64, 64, 4, True)  # False < True


def test_equal_configs_hash_equal_and_deduplicate():
    cfg = Config(FP16, 128, 64, 64, 4, True, K_mma_load_K_tiles=2, V_mma_load_K_tiles=2)
    copies = [cfg, dataclasses.replace(cfg), parse_kernel_name_into_config(cfg.short_form())]
    assert len(set(copies)) == 1
    different = dataclasses.replace(cfg, V_mma_load_K_tiles=0)
    assert different != cfg
    assert len({cfg, different}) == 2


# ----------------------------------------------------------------------------------------------
# DType


@pytest.mark.parametrize("text", ["FP16", "fp16", "float16", "Half", "torch.float16", " fp16 "])
def test_dtype_from_string_fp16(text):
    assert DType.from_string(text) is DType.FP16


@pytest.mark.parametrize("text", ["BF16", "bf16", "bfloat16", "torch.bfloat16", "BFloat16"])
def test_dtype_from_string_bf16(text):
    assert DType.from_string(text) is DType.BF16


@pytest.mark.parametrize("text", ["fp32", "float", "torch.float32", "", "f16"])
def test_dtype_from_string_rejects_other_types(text):
    with pytest.raises(ValueError, match="unsupported dtype"):
        DType.from_string(text)


def test_dtype_codes_and_cpp_names():
    assert (int(DType.FP16), int(DType.BF16)) == (5, 15)
    assert (DType.FP16.to_cpp_str(), DType.BF16.to_cpp_str()) == ("DType::FP16", "DType::BF16")


def test_dtype_torch_conversions():
    torch = pytest.importorskip("torch")
    assert DType.FP16.to_torch_dtype() is torch.float16
    assert DType.BF16.to_torch_dtype() is torch.bfloat16
    assert DType.E4M3.to_torch_dtype() is torch.float8_e4m3fn
    assert DType.from_torch_dtype(torch.bfloat16) is DType.BF16
    assert DType.from_torch_dtype(torch.float8_e4m3fn) is DType.E4M3
    for dtype in DType:
        assert dtype.element_bytes == torch.empty(0, dtype=dtype.to_torch_dtype()).element_size()
        assert f"torch.{dtype.torch_name}" == str(dtype.to_torch_dtype())
    with pytest.raises(ValueError):
        DType.from_torch_dtype(torch.float32)
    with pytest.raises(ValueError, match="unsupported dtype 'torch.float8_e5m2'"):
        DType.from_torch_dtype(torch.float8_e5m2)


@pytest.mark.parametrize("text", ["E4M3", "e4m3", "fp8", "FP8", "float8_e4m3fn", "torch.float8_e4m3fn"])
def test_dtype_from_string_e4m3(text):
    assert DType.from_string(text) is DType.E4M3


def test_e4m3_is_an_8_bit_type_of_its_own_code():
    assert (int(E4M3), E4M3.to_cpp_str(), E4M3.element_bytes, E4M3.torch_name) == (24, "DType::E4M3", 1, "float8_e4m3fn")
    assert (FP16.element_bytes, BF16.element_bytes) == (2, 2)
    assert DTYPES == (FP16, BF16) and FP8_DTYPES == (E4M3,)


def test_output_dtype_is_the_inputs_or_for_e4m3_the_16_bit_type_asked_for():
    assert output_dtype(FP16) is FP16 and output_dtype(BF16, BF16) is BF16
    assert output_dtype(E4M3) is BF16 and output_dtype(E4M3, FP16) is FP16 and output_dtype(E4M3, BF16) is BF16
    with pytest.raises(ValueError, match="out_dtype: must be float16 or bfloat16 for float8_e4m3fn inputs, got float8"):
        output_dtype(E4M3, E4M3)
    with pytest.raises(ValueError, match="out_dtype: chooses the output's dtype of float8_e4m3fn inputs only; float16"):
        output_dtype(FP16, BF16)


def test_module_imports_without_torch():
    modules = [path.stem for path in (REPO_ROOT / "py" / "flash_helpers").glob("*.py") if path.stem != "__init__"]
    assert "sm80_config" in modules and "kernel_sets" in modules
    code = f"import sys; sys.modules['torch'] = None; import flash_helpers, {', '.join('flash_helpers.' + m for m in modules)}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "py")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ----------------------------------------------------------------------------------------------
# Sizes and FLOP counts


def test_smem_bytes_and_its_limit():
    assert Config(FP16, 128, 64, 64, 4).smem_bytes() == (64 + 2 * 64) * 128 * 2 == 49152
    eager = Config(FP16, 128, 128, 64, 4, True, True)
    assert eager.smem_bytes() == (128 + 2 * 2 * 64) * 128 * 2 == 98304
    # d_head 96 and 32 rows carry one 16-byte chunk of padding in the conflict-free layout.
    assert Config(FP16, 96, 64, 64, 4, swizzled=True).smem_bytes() == (64 + 2 * 64) * (96 * 2 + 16)
    assert Config(FP16, 96, 64, 64, 4).smem_bytes() == (64 + 2 * 64) * 96 * 2
    too_big = Config(FP16, 256, 128, 128, 4, True, True)
    assert too_big.smem_bytes() > MAX_SMEM_BYTES and "shared memory" in too_big.validity_error()
    assert all(cfg.smem_bytes() <= MAX_SMEM_BYTES for cfg in get_all_kernel_configs())


def test_flop_counts():
    assert attention_flop(2, 3, 128, 64) == 25_165_824  # 4 * 2 * 3 * 128**2 * 64
    # + softmax 5 * 2 * 3 * 128**2 = 491_520, + normalisation 2 * 3 * 128 * 64 = 49_152
    assert total_flop(2, 3, 128, 64) == 25_706_496
    assert attention_flop(16, 16, 4096, 128) == 4 * 16 * 16 * 4096**2 * 128


# ----------------------------------------------------------------------------------------------
# Validity rules


GOOD_CONFIGS = [
    Config(FP16, 128, 64, 64, 4),
    Config(BF16, 64, 64, 32, 4, True),
    Config(FP16, 128, 128, 128, 8, True, Q_mma_load_K_tiles=4, K_mma_load_K_tiles=4, V_mma_load_K_tiles=4),
    Config(FP16, 64, 64, 64, 4, True, K_mma_load_K_tiles=2, V_mma_load_K_tiles=2),
    Config(BF16, 64, 128, 128, 8, False, Q_mma_load_K_tiles=2, K_mma_load_K_tiles=2),
    Config(FP16, 128, 128, 32, 4, True, K_mma_load_K_tiles=4),
    # Fewer than 16 rows per warp: the warps split each tile's keys.
    Config(BF16, 128, 16, 64, 4, True, True, True, 0, 1, 0, True, True),
    Config(FP16, 64, 32, 64, 4, True, K_mma_load_K_tiles=1, V_mma_load_K_tiles=1),
    Config(FP16, 128, 64, 64, 8),
]


@pytest.mark.parametrize(
    ("cfg", "row_warps", "key_groups", "warp_keys"),
    [
        (Config(FP16, 128, 64, 64, 4), 4, 1, 64),
        (Config(FP16, 128, 128, 32, 8), 8, 1, 32),
        (Config(FP16, 128, 16, 64, 4), 1, 4, 16),
        (Config(FP16, 128, 32, 128, 4), 2, 2, 64),
        (Config(FP16, 128, 64, 64, 8), 4, 2, 32),
    ],
)
def test_blocks_of_fewer_than_16_rows_per_warp_split_the_keys(cfg, row_warps, key_groups, warp_keys):
    assert (cfg.row_warps, cfg.key_groups, cfg.warp_keys) == (row_warps, key_groups, warp_keys)

# (config, words its reason must contain): each config breaks exactly one rule.
BAD_CONFIGS = [
    (Config(E4M3, 128, 64, 64, 4), ["dtype E4M3", "16-bit inputs", "sm90(E4M3, ...)"]),
    (Config(FP16, 80, 64, 64, 4), ["d_head"]),
    (Config(FP16, 512, 64, 64, 4), ["d_head"]),
    (Config(FP16, 128, 48, 64, 4), ["B_r"]),
    (Config(FP16, 128, 16, 32, 4), ["B_c", "4 key groups", "16 keys"]),
    (Config(FP16, 64, 32, 64, 8), ["merge", "shared memory"]),
    (Config(FP16, 128, 16, 64, 4, V_mma_load_K_tiles=1), ["V_mma_load_K_tiles", "B_c / 4 key groups"]),
    (Config(FP16, 128, 64, 16, 4), ["B_c"]),
    (Config(FP16, 128, 64, 64, 2), ["n_warps"]),
    (Config(FP16, 128, 64, 64, 4, False, eager_load_blocks=True), ["eager_load_blocks", "async_copy"]),
    (Config(FP16, 128, 64, 64, 4, Q_mma_load_K_tiles=3, K_mma_load_K_tiles=3), ["Q_mma_load_K_tiles"]),
    (Config(FP16, 128, 64, 64, 4, K_mma_load_K_tiles=8), ["K_mma_load_K_tiles", "d_head"]),
    (Config(FP16, 64, 64, 64, 4, K_mma_load_K_tiles=4), ["K_mma_load_K_tiles", "d_head"]),
    (Config(FP16, 128, 64, 64, 4, K_mma_load_K_tiles=3), ["K_mma_load_K_tiles"]),
    (Config(FP16, 128, 64, 32, 4, V_mma_load_K_tiles=2), ["V_mma_load_K_tiles", "B_c"]),
    (Config(FP16, 128, 64, 64, 4, V_mma_load_K_tiles=4), ["V_mma_load_K_tiles", "B_c"]),
    (Config(FP16, 128, 64, 64, 4, Q_mma_load_K_tiles=2), ["Q_mma_load_K_tiles", "K_mma_load_K_tiles"]),
    (
        Config(FP16, 128, 64, 64, 4, Q_mma_load_K_tiles=2, K_mma_load_K_tiles=4),
        ["Q_mma_load_K_tiles", "K_mma_load_K_tiles"],
    ),
]


@pytest.mark.parametrize("cfg", GOOD_CONFIGS, ids=Config.short_form)
def test_good_configs_are_valid(cfg):
    assert cfg.validity_error() is None
    assert cfg.is_valid()
    cfg.validate()


@pytest.mark.parametrize(("cfg", "words"), BAD_CONFIGS, ids=[cfg.short_form() for cfg, _ in BAD_CONFIGS])
def test_bad_configs_are_rejected_with_a_reason_naming_the_field(cfg, words):
    reason = cfg.validity_error()
    assert reason is not None and reason.endswith(".")
    for word in words:
        assert word in reason
    assert not cfg.is_valid()
    with pytest.raises(ValueError) as error:
        cfg.validate()
    assert str(error.value) == reason


def test_double_buffering_needs_chunked_k_or_v():
    whole = Config(FP16, 128, 128, 64, 4, True, mma_double_buffer_loads=True)
    assert "mma_double_buffer_loads" in whole.validity_error()
    assert dataclasses.replace(whole, K_mma_load_K_tiles=1).is_valid()
    assert dataclasses.replace(whole, V_mma_load_K_tiles=2).is_valid()


def test_the_first_failing_rule_is_reported():
    assert "d_head" in Config(FP16, 80, 64, 64, 2).validity_error()
    # eager without async breaks the async rule before the double-buffering one.
    cfg = Config(FP16, 128, 64, 64, 4, eager_load_blocks=True, mma_double_buffer_loads=True)
    assert "async_copy" in cfg.validity_error()


# ----------------------------------------------------------------------------------------------
# Sets


@pytest.mark.parametrize("set_name", SET_NAMES)
def test_sets_are_sorted_unique_and_valid(set_name):
    configs = config_sets()[set_name]
    assert configs == sorted(set(configs))
    assert [cfg for cfg in configs if not cfg.is_valid()] == []


@pytest.mark.parametrize("set_name", [name for name in SET_NAMES if name != "all"])
def test_every_set_is_part_of_all(set_name):
    assert set(config_sets()[set_name]) <= set(get_all_kernel_configs())


def test_all_covers_every_dtype_and_valid_block_size():
    configs = of_family(get_all_kernel_configs(), Config)
    assert {(cfg.d_head, cfg.B_r, cfg.B_c, cfg.n_warps) for cfg in configs} == valid_block_sizes()
    assert {cfg.dtype for cfg in configs} == {FP16, BF16}
    for cfg in GOOD_CONFIGS:
        assert cfg in configs


def test_tune_is_the_all_knobs_chunked_subset_of_all():
    assert get_autotuning_kernel_configs() == [cfg for cfg in get_all_kernel_configs() if should_autotune_config(cfg)]
    tune = of_family(get_autotuning_kernel_configs(), Config)
    knobs = ("async_copy", "eager_load_blocks", "swizzled", "mma_double_buffer_loads", "optimized_softmax")
    assert all(getattr(cfg, knob) for cfg in tune for knob in knobs)
    assert all({cfg.K_mma_load_K_tiles, cfg.V_mma_load_K_tiles} <= {1, 2} for cfg in tune)
    assert {cfg.Q_mma_load_K_tiles == 0 for cfg in tune} == {True, False}
    assert any(cfg.B_c == 128 for cfg in tune)
    assert any(cfg.n_warps == 8 for cfg in tune)


def test_should_autotune_config_filters():
    good = parse_kernel_name_into_config("(FP16, 128, 128, 64, 4): async+eager+swizzled+load_2_2_1_tiles+buffer+opt_softmax")
    assert should_autotune_config(good)
    for knob in ("async_copy", "eager_load_blocks", "swizzled", "mma_double_buffer_loads", "optimized_softmax"):
        without = dataclasses.replace(good, **{knob: False})
        if knob == "async_copy":
            without = dataclasses.replace(without, eager_load_blocks=False)
        assert not should_autotune_config(without), knob
    assert not should_autotune_config(dataclasses.replace(good, Q_mma_load_K_tiles=4, K_mma_load_K_tiles=4))
    assert not should_autotune_config(dataclasses.replace(good, V_mma_load_K_tiles=0))
    assert not should_autotune_config(dataclasses.replace(good, d_head=80))


def test_tune_can_be_restricted_to_dtypes_and_head_sizes():
    tune = get_autotuning_kernel_configs(dtypes=(BF16,), d_heads=(64,))
    assert tune
    assert {(cfg.dtype, cfg.d_head) for cfg in tune} == {(BF16, 64)}


def test_progression_steps_are_cumulative():
    assert SM80_PROGRESSION_STEPS[0] == ("base", "")
    previous = set()
    for _, flags in SM80_PROGRESSION_STEPS:
        current = set(filter(None, flags.split("+")))
        assert previous < current or current == previous == set()
        previous = current


def step_config(dtype, d_head, block_size, flags):
    head = "({}, {}, {}, {}, {})".format(dtype.name, d_head, *block_size)
    return parse_kernel_name_into_config(f"{head}: {flags}" if flags else head)


@pytest.mark.parametrize(("step", "flags"), SM80_PROGRESSION_STEPS)
def test_prog_holds_every_step(step, flags):
    prog = get_kernel_progression_configs()
    for dtype in (FP16, BF16):
        assert step_config(dtype, 128, SM80_PROGRESSION_BLOCK, flags) in prog


def test_prog_is_at_one_block_size_and_each_step_adds_knobs():
    prog = of_family(get_kernel_progression_configs(), Config)
    assert {(cfg.d_head, cfg.B_r, cfg.B_c, cfg.n_warps) for cfg in prog} == {(128, *SM80_PROGRESSION_BLOCK)}
    assert len(prog) == 2 * len(SM80_PROGRESSION_STEPS)
    assert Config(FP16, 128, *SM80_PROGRESSION_BLOCK) in prog
    assert Config(BF16, 128, *SM80_PROGRESSION_BLOCK, True) in prog
    knobs = [set(flags.split("+")) - {""} for _, flags in SM80_PROGRESSION_STEPS]
    assert all(len(later) > len(earlier) for earlier, later in zip(knobs, knobs[1:]))


def test_progall_covers_every_valid_block_size():
    progall = get_kernel_progression_configs(all_block_sizes=True)
    assert set(get_kernel_progression_configs()) <= set(progall)
    expected = {block for block in valid_block_sizes() if block[0] == 128}
    assert {(cfg.d_head, cfg.B_r, cfg.B_c, cfg.n_warps) for cfg in of_family(progall, Config)} == expected


def test_block_size_key_selects_sm80_tuning_configs():
    expected = [cfg for cfg in of_family(get_autotuning_kernel_configs(), Config) if (cfg.B_r, cfg.B_c) == (128, 64)]
    assert expected
    assert get_kernel_configs("128,64") == expected
    assert get_kernel_configs(" 128, 64 ") == expected
    # The Hopper tuning set has (128, 128) too; the key keeps to the SM80 family.
    assert any((cfg.B_r, cfg.B_c) == (128, 128) for cfg in of_family(get_autotuning_kernel_configs(), Hopper))
    assert of_family(get_kernel_configs("128,128"), Hopper) == []


def test_block_size_key_without_configs_is_an_error():
    with pytest.raises(ValueError, match="96"):
        get_kernel_configs("96,64")


def test_kernels_env_selects_the_set(monkeypatch):
    assert get_kernel_configs() == get_all_kernel_configs()
    monkeypatch.setenv(KERNELS_ENV, "prog")
    assert get_kernel_configs() == get_kernel_progression_configs()
    assert get_kernel_configs("tune") == get_autotuning_kernel_configs()
    monkeypatch.setenv(KERNELS_ENV, "")
    assert get_kernel_configs() == get_all_kernel_configs()


def test_named_keys_ignore_case_and_whitespace():
    assert get_kernel_configs(" TUNE ") == get_autotuning_kernel_configs()


def test_short_form_keys_are_parsed_sorted_and_deduplicated():
    first, second = "(FP16, 128, 64, 64, 4): async", "(BF16, 64, 64, 32, 4)"
    configs = get_kernel_configs(f"{first}; {second};{first};")
    assert configs == [Config(FP16, 128, 64, 64, 4, True), Config(BF16, 64, 64, 32, 4)]


def test_short_form_keys_must_be_valid():
    with pytest.raises(ValueError, match="not a valid configuration.*eager_load_blocks requires async_copy"):
        get_kernel_configs("(FP16, 128, 64, 64, 4): eager")


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(ValueError) as error:
        get_kernel_configs("fastest")
    for key in ("'default'", "'all'", "'prog'", "'progall'", "'tune'", "B_r,B_c", "'fastest'"):
        assert key in str(error.value)


def test_tools_select_the_default_build_by_name():
    # Tools name the default build "default", as FLASH_BUILD_KERNELS does (the dispatch table's sweep).
    assert get_kernel_configs("default") == get_kernels_to_build("default", "8.0;9.0")


def test_default_build_is_the_curated_list():
    default = get_kernels_to_build()
    assert default == sorted(parse_kernel_name_into_config(text) for text in DEFAULT_BUILD_KERNELS + DECODE_KERNELS)
    # At least one configuration per dtype and head size of either family (the Hopper family's 48, 160
    # and 224 included), so a default build serves every problem, but d_head 80, which d_head 96's
    # blocks serve as fast as its own first block (default_set.py).
    head_sizes = (set(D_HEADS) | set(sm90_config.D_HEADS)) - {80}
    sixteen_bit = [cfg for cfg in default if cfg.dtype != E4M3]
    assert {(cfg.dtype, cfg.d_head) for cfg in sixteen_bit} == {(dtype, d) for dtype in (FP16, BF16) for d in head_sizes}
    # The decoding configurations whose warps split the keys are chosen by rule, not swept.
    assert {cfg for cfg in sixteen_bit if getattr(cfg, "key_groups", 1) == 1} <= set(get_autotuning_kernel_configs())
    # e4m3: the Hopper family's first configurations at the head sizes most models use, not yet tuned.
    fp8 = [cfg for cfg in default if cfg.dtype == E4M3]
    assert {cfg.d_head for cfg in fp8} == {64, 128, 256} and all(cfg.family == "sm90" for cfg in fp8)
    assert not set(fp8) & set(get_autotuning_kernel_configs())


def test_build_env_and_keys(monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "all")  # the run-time selection must not leak into the build's
    assert get_kernels_to_build() == get_kernels_to_build("default")
    monkeypatch.setenv(BUILD_KERNELS_ENV, "prog")
    assert get_kernels_to_build() == get_kernel_progression_configs()
    assert get_kernels_to_build("default") == sorted(
        map(parse_kernel_name_into_config, DEFAULT_BUILD_KERNELS + DECODE_KERNELS)
    )
    assert get_kernels_to_build("tune") == get_autotuning_kernel_configs()
    with pytest.raises(ValueError, match="'default'"):
        get_kernels_to_build("defualt")


def test_mangled_kernel_name_matches_the_compiler():
    """Device symbols read off a cubin nvcc 13 compiled (cuobjdump): every field spelled out."""
    assert FlashForwardKernelConfig(DType.BF16, 64, 128, 32, 8).mangled_kernel_name() == (
        "_ZN5flash4sm8020flash_forward_kernelINS0_25StaticForwardKernelConfigIXtlNS0_24FlashForwardKernelConfigE"
        "LNS_5DTypeE15ELi64ELi128ELi32ELi8ELb0ELb0ELb0ELi0ELi0ELi0ELb0ELb0EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS_13ForwardParamsE"
    )
    cfg = FlashForwardKernelConfig(DType.FP16, 128, 64, 64, 4, async_copy=True, Q_mma_load_K_tiles=2, K_mma_load_K_tiles=2)
    assert cfg.mangled_kernel_name() == (
        "_ZN5flash4sm8020flash_forward_kernelINS0_25StaticForwardKernelConfigIXtlNS0_24FlashForwardKernelConfigE"
        "LNS_5DTypeE5ELi128ELi64ELi64ELi4ELb1ELb0ELb0ELi2ELi2ELi0ELb0ELb0EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS_13ForwardParamsE"
    )


def test_demangled_kernel_name_is_the_demangled_device_symbol():
    """c++filt of the first symbol above."""
    assert FlashForwardKernelConfig(DType.BF16, 64, 128, 32, 8).demangled_kernel_name() == (
        "void flash::sm80::flash_forward_kernel<flash::sm80::StaticForwardKernelConfig<flash::sm80::FlashForwardKernelConfig"
        "{(flash::DType)15, 64, 128, 32, 8, false, false, false, 0, 0, 0, false, false}>, (flash::MaskKind)0, false, false, false, false>"
        "(flash::ForwardParams)"
    )


def test_names_printed_before_the_families_still_parse():
    """Nsight Compute reports saved from earlier builds name the kernel without the family's namespace."""
    old = (
        "void flash::flash_forward_kernel<flash::StaticForwardKernelConfig<flash::FlashForwardKernelConfig"
        "{(flash::DType)15, 64, 128, 32, 8, false, false, false, 0, 0, 0, false, false}> >(flash::ForwardKernelArgs)"
    )
    assert parse_kernel_name_into_config(old) == FlashForwardKernelConfig(DType.BF16, 64, 128, 32, 8)


def test_keys_joined_by_plus_select_the_union():
    union = get_kernel_configs("tune+prog")
    assert union == sorted(set(get_kernel_configs("tune")) | set(get_kernel_configs("prog")))
    assert get_kernels_to_build("default+prog") == sorted(set(get_kernels_to_build()) | set(get_kernel_configs("prog")))
    with pytest.raises(ValueError, match="unknown kernel set"):
        get_kernel_configs("tune+nonsense")


# ----------------------------------------------------------------------------------------------
# The Hopper family

SM90_FULL = Hopper(FP16, 128, 128, 128, 2, True, True, True)


@pytest.mark.parametrize("set_name", [name for name in SET_NAMES if name != "128,64"])
def test_sets_hold_both_families(set_name):
    assert {cfg.family for cfg in config_sets()[set_name]} == {"sm80", "sm90"}


def test_hopper_short_form_lists_flags_in_fixed_order():
    assert SM90_FULL.short_form() == "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap"
    assert Hopper(BF16, 64, 64, 96, 3, intra_wg_overlap=True).short_form() == "sm90(BF16, 64, 64, 96, 3): overlap"
    assert Hopper(BF16, 64, 64, 96, 1).short_form() == "sm90(BF16, 64, 64, 96, 1)"
    assert parse_kernel_name_into_config(sm90_config.SHORT_FORM_EXAMPLE) == SM90_FULL


def test_hopper_cpp_struct():
    assert SM90_FULL.to_cpp_struct() == (
        "HopperForwardKernelConfig{DType::FP16, 128, 128, 128, 2, true, true, true, false, false, false, false, false}"
    )
    assert Hopper(BF16, 64, 192, 80, 4, True).to_cpp_struct() == (
        "HopperForwardKernelConfig{DType::BF16, 64, 192, 80, 4, true, false, false, false, false, false, false, false}"
    )


def test_hopper_demangled_kernel_name():
    """c++filt of the first symbol of test_hopper_mangled_kernel_name."""
    assert SM90_FULL.demangled_kernel_name() == (
        "void flash::sm90::hopper_forward_kernel<flash::sm90::StaticHopperKernelConfig<"
        "flash::sm90::HopperForwardKernelConfig{(flash::DType)5, 128, 128, 128, 2, true, true, true, false, false, false, false, false}>, "
        "(flash::MaskKind)0, false, false, false, false>(flash::sm90::KernelParams)"
    )
    causal_tails = ProblemVariant(MaskKind.CAUSAL, masked_tails=True)
    suffix = ", (flash::MaskKind)1, true, false, false, false>(flash::sm90::KernelParams)"
    assert SM90_FULL.demangled_kernel_name(causal_tails).endswith(suffix)


def test_hopper_mangled_kernel_name():
    """Both symbols as read off an sm_90a cubin nvcc 13 compiled (readelf -s)."""
    assert SM90_FULL.mangled_kernel_name() == (
        "_ZN5flash4sm9021hopper_forward_kernelINS0_24StaticHopperKernelConfigIXtlNS0_25HopperForwardKernelConfigE"
        "LNS_5DTypeE5ELi128ELi128ELi128ELi2ELb1ELb1ELb1ELb0ELb0ELb0ELb0ELb0EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS0_12KernelParamsE"
    )
    assert Hopper(BF16, 64, 192, 80, 4, True).mangled_kernel_name(ProblemVariant(MaskKind.LOCAL, True, True)) == (
        "_ZN5flash4sm9021hopper_forward_kernelINS0_24StaticHopperKernelConfigIXtlNS0_25HopperForwardKernelConfigE"
        "LNS_5DTypeE15ELi64ELi192ELi80ELi4ELb1ELb0ELb0ELb0ELb0ELb0ELb0ELb0EEEEELNS_8MaskKindE2ELb1ELb1ELb0ELb0EEEvNS0_12KernelParamsE"
    )


def test_hopper_file_stem_example_and_uniqueness():
    assert SM90_FULL.file_stem() == "fp16_d128_br128_bc128_s2_ws_pingpong_overlap"
    assert Hopper(BF16, 64, 64, 96, 1).file_stem() == "bf16_d64_br64_bc96_s1"
    configs = get_all_kernel_configs()
    names = {f"{cfg.family}_{cfg.file_stem()}" for cfg in configs}  # the generator's file names
    assert len(names) == len(configs)
    assert all(name.replace("_", "").isalnum() and name.islower() for name in names)


@pytest.mark.parametrize(
    "text",
    [
        "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap",
        "sm90(FP16, 128, 128, 128, 2): overlap+ws+pingpong",
        "  sm90 ( fp16,128,128,128,2 ) : pingpong + overlap+ws \n",
        "HopperForwardKernelConfig{DType::FP16, 128, 128, 128, 2, true, true, true, false}",
        "HopperForwardKernelConfig{5, (int)128, 128, 128, 2, (bool)1, 1, true}",
        "void flash::sm90::hopper_forward_kernel<flash::sm90::StaticHopperKernelConfig<"
        "flash::sm90::HopperForwardKernelConfig{(flash::DType)5, 128, 128, 128, 2, true, true, true, false, false, false}>, "
        "(flash::MaskKind)1, true, false, false, false>(flash::sm90::KernelParams)",
    ],
)
def test_parse_hopper_spellings(text):
    assert parse_kernel_name_into_config(text) == SM90_FULL


@pytest.mark.parametrize(
    "field, short, struct_tail",
    [
        ("Q_in_registers", "qregs", "true, true, true, true, true, false, false, false}"),
        ("multicast", "mcast", "true, true, true, true, false, true, false, false}"),
        ("deferred_O_rescale", "odefer", "true, true, true, true, false, false, false, true}"),
    ],
)
def test_hopper_flag_spellings(field, short, struct_tail):
    """A Hopper flag on a persistent block: its short form (any order parses back), file stem and
    C++ struct."""
    cfg = dataclasses.replace(SM90_FULL, persistent=True, **{field: True})
    assert cfg.short_form() == f"sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap+persistent+{short}"
    assert parse_kernel_name_into_config(f"sm90(FP16, 128, 128, 128, 2): {short}+persistent+ws+pingpong+overlap") == cfg
    assert cfg.file_stem() == f"fp16_d128_br128_bc128_s2_ws_pingpong_overlap_persistent_{short}"
    assert cfg.to_cpp_struct().endswith(struct_tail)


def test_hopper_Q_in_registers_flag():
    cfg = dataclasses.replace(SM90_FULL, persistent=True, Q_in_registers=True)
    # The sweep tries Q both ways wherever its registers fit.
    tune = of_family(get_autotuning_kernel_configs(), Hopper)
    assert cfg in tune and dataclasses.replace(cfg, Q_in_registers=False) in tune
    assert dataclasses.replace(cfg, B_c=160, Q_in_registers=False) in tune
    assert dataclasses.replace(cfg, B_c=160) not in tune


def test_hopper_multicast_flag():
    cfg = dataclasses.replace(SM90_FULL, persistent=True, multicast=True)
    assert cfg.mangled_kernel_name().endswith("ELb1ELb1ELb1ELb1ELb0ELb1ELb0ELb0EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS0_12KernelParamsE")
    # Each block holds whole tiles: the registers stay, and the shared memory grows by the ring through
    # which a persistent pair's first block hands out the work tiles (four barriers and a word).
    plain = dataclasses.replace(cfg, multicast=False)
    assert cfg.smem_bytes() == plain.smem_bytes() + 5 * 8 and cfg.register_estimate() == plain.register_estimate()
    single_pass = dataclasses.replace(cfg, persistent=False)
    assert single_pass.smem_bytes() == dataclasses.replace(single_pass, multicast=False).smem_bytes()
    tune = of_family(get_autotuning_kernel_configs(), Hopper)
    assert cfg in tune and dataclasses.replace(cfg, d_head=64) in tune and dataclasses.replace(cfg, d_head=96) not in tune


def test_hopper_deferred_O_rescale_flag():
    """odefer (its short form and struct: test_hopper_flag_spellings): the symbol's last field as read off
    an sm_90a object nvcc 13 compiled, a block of the same tiles and registers as its twin, the overlap
    it needs, and its absence from the sweep (its twin gives the same bits; tests/test_forward.py
    checks them)."""
    cfg = dataclasses.replace(SM90_FULL, dtype=BF16, persistent=True, deferred_O_rescale=True)
    assert cfg.mangled_kernel_name().endswith(
        "ELi2ELb1ELb1ELb1ELb1ELb0ELb0ELb0ELb1EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS0_12KernelParamsE"
    )
    assert cfg.validity_error() is None
    twin = dataclasses.replace(cfg, deferred_O_rescale=False)
    assert (cfg.smem_bytes(), cfg.consumer_registers(), cfg.register_estimate()) == (
        twin.smem_bytes(), twin.consumer_registers(), twin.register_estimate()
    )
    reason = dataclasses.replace(cfg, intra_wg_overlap=False).validity_error()
    assert reason is not None and reason.startswith("deferred_O_rescale needs intra_wg_overlap")
    assert twin in get_autotuning_kernel_configs(d_heads=[128]) and not should_autotune_config(cfg)


def test_parse_hopper_names_without_trailing_false_fields():
    name = (
        "void flash::sm90::hopper_forward_kernel<flash::sm90::StaticHopperKernelConfig<"
        "flash::sm90::HopperForwardKernelConfig{(flash::DType)15, 64, 192, 80, 4, true}>"
    )
    cfg = parse_kernel_name_into_config(name)
    assert cfg == Hopper(BF16, 64, 192, 80, 4, True)
    assert cfg.pingpong is False and cfg.intra_wg_overlap is False
    assert parse_kernel_name_into_config("HopperForwardKernelConfig{5, 128, 128, 128, 2}") == Hopper(FP16, 128, 128, 128, 2)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("sm90(FP16, 128, 128, 128, 2): turbo", ["unknown flag 'turbo'", "ws, pingpong, overlap"]),
        ("sm90(FP16, 128, 128, 128, 2): ws+ws", ["'ws' repeats"]),
        ("sm90(FP16, 128, 128, 128, 2): ws+pingpong+ws", ["'ws' repeats"]),
        ("sm90(FP16, 128, 128, 128, 2): async", ["unknown flag 'async'"]),
        ("(FP16, 128, 64, 64, 4): ws", ["unknown flag 'ws'", "load_<Q>_<K>_<V>_tiles"]),
        ("sm90(FP16, 128, 128, 128, 2):", ["unknown flag ''"]),
        ("sm90(FP16, 128, 128, 128)", ["sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap", "(FP16, 128, 64, 64, 4)"]),
        ("sm80(FP16, 128, 64, 64, 4)", ["HopperForwardKernelConfig{...}", "FlashForwardKernelConfig{...}"]),
        ("sm90(FP32, 128, 128, 128, 2)", ["unsupported dtype 'FP32'"]),
        ("HopperForwardKernelConfig{5, 128, 128, 128, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1}", ["14 initializer items", "13 fields"]),
        ("HopperForwardKernelConfig{5, 128, 128, 128, 2, 2}", ["'2' is not a valid warp_specialized"]),
        ("HopperForwardKernelConfig{5, 128, 128, true, 2}", ["'true' is not a valid B_c"]),
    ],
)
def test_hopper_parse_errors_are_value_errors_quoting_the_name(name, words):
    with pytest.raises(ValueError) as error:
        parse_kernel_name_into_config(name)
    assert repr(name) in str(error.value)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize(
    ("fields", "error", "field_name"),
    [
        ({"dtype": 6}, ValueError, "dtype"),
        ({"stages": "2"}, TypeError, "stages"),
        ({"B_c": True}, TypeError, "B_c"),
        ({"warp_specialized": 1}, TypeError, "warp_specialized"),
        ({"intra_wg_overlap": None}, TypeError, "intra_wg_overlap"),
    ],
)
def test_hopper_construction_checks_types(fields, error, field_name):
    arguments = {"dtype": FP16, "d_head": 128, "B_r": 128, "B_c": 128, "stages": 2, **fields}
    with pytest.raises(error, match=field_name):
        Hopper(**arguments)


def test_hopper_configs_are_immutable_hashable_and_never_equal_an_sm80_one():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SM90_FULL.stages = 3
    assert len({SM90_FULL, dataclasses.replace(SM90_FULL), parse_kernel_name_into_config(SM90_FULL.short_form())}) == 1
    # Same field values, different families.
    assert Hopper(FP16, 128, 64, 64, 4) != Config(FP16, 128, 64, 64, 4)


def test_hopper_threads_and_warpgroups():
    assert (SM90_FULL.consumer_warpgroups, SM90_FULL.n_threads) == (2, 384)
    assert (Hopper(FP16, 64, 192, 64, 2).consumer_warpgroups, Hopper(FP16, 64, 192, 64, 2).n_threads) == (3, 384)
    assert Hopper(FP16, 64, 64, 64, 2, True).n_threads == 256


def test_hopper_smem_bytes():
    # Q, a K and a V tile per stage, 1024 bytes of alignment slack, then 8 bytes for each mbarrier
    # (Q full and empty per consumer warpgroup, 4 per stage) and each warpgroup's work-tile slot (8 bytes).
    assert SM90_FULL.smem_bytes() == 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + 1024 + 8 * (2 * 2 + 2 * 4) + 8 * 2 == 164976
    assert Hopper(BF16, 64, 64, 80, 1).smem_bytes() == 64 * 64 * 2 + 1 * 2 * 80 * 64 * 2 + 1024 + 8 * (2 + 4) + 8
    assert Hopper(FP16, 256, 128, 80, 2).smem_bytes() == 230512  # just fits
    # Persistent: an O tile of Q's size more.
    persistent = Hopper(FP16, 128, 128, 128, 2, True, True, True, True)
    assert persistent.smem_bytes() == SM90_FULL.smem_bytes() + 128 * 128 * 2
    assert all(cfg.smem_bytes() <= MAX_SMEM_BYTES for cfg in get_all_kernel_configs())


@pytest.mark.parametrize(
    ("cfg", "budget"),
    [
        (Hopper(FP16, 128, 64, 128, 2, True), 255),  # 65536 / 256 threads: a thread's most, no setmaxnreg
        (Hopper(FP16, 128, 128, 128, 2, True), 240),  # setmaxnreg: the producer keeps 24
        (Hopper(FP16, 128, 192, 128, 2, True), 160),  # setmaxnreg: the producer keeps 32
        (Hopper(FP16, 128, 64, 128, 2), 255),  # 512: a thread's most
        (Hopper(FP16, 128, 128, 128, 2), 255),  # 256
        (Hopper(FP16, 128, 192, 128, 2), 168),  # 170.7, rounded down to a multiple of 8
    ],
    ids=str,
)
def test_hopper_consumer_registers(cfg, budget):
    assert cfg.consumer_registers() == budget


@pytest.mark.parametrize(
    ("cfg", "producer", "varlen_producer"),
    [
        (Hopper(FP16, 128, 128, 128, 2, True), 24, 40),  # 3 x 168 over two consumers of 240 (232 varlen)
        (Hopper(FP16, 128, 192, 128, 2, True), 32, 32),  # 4 x 128 over three of 160
        (Hopper(E4M3, 128, 128, 128, 2, True, True), 56, 56),  # V by rows: two consumers of 224
        (Hopper(E4M3, 64, 192, 128, 2, True, True, True), 56, 56),  # by rows: three of 152
        (Hopper(E4M3, 256, 128, 128, 2, True, True), 24, 40),  # by matrices, as with 16-bit inputs
        (Hopper(FP16, 128, 128, 128, 2), 255, 255),  # no warp specialization: no registers move
    ],
    ids=str,
)
def test_hopper_producer_registers(cfg, producer, varlen_producer):
    """The producer keeps what the block's registers leave over its consumers' (setmaxnreg moves
    exactly that), in the dense and the varlen kernels."""
    assert (cfg.producer_registers(), cfg.producer_registers(varlen=True)) == (producer, varlen_producer)


def test_hopper_varlen_kernels_fit_their_consumer_registers():
    """The varlen kernels of two consumer warpgroups give them fewer registers than the others
    (their producer keeps more): every configuration built with varlen kernels needs no more."""
    configs = [parse_kernel_name_into_config(name) for name in VARLEN_KERNELS]
    moving = [cfg for cfg in configs if cfg.family == "sm90" and cfg.warp_specialized and cfg.consumer_warpgroups == 2]
    assert moving, "the varlen kernels include Hopper configurations of two consumer warpgroups"
    for cfg in moving:
        assert cfg.register_estimate() <= sm90_config.VARLEN_CONSUMER_REGISTERS, cfg.short_form()


def test_hopper_register_estimate():
    assert SM90_FULL.register_estimate() == 128 // 2 + 128 // 2 + 128 // 4 + 32 == 192
    assert Hopper(FP16, 64, 192, 128, 2, True, True, True).register_estimate() == 160  # exactly the budget
    assert Hopper(FP16, 64, 192, 128, 2, True, True, True).is_valid()
    # Q in registers: d_head / 4 more, which d_head 128 with 144 keys still fits and 160 keys does not.
    assert dataclasses.replace(SM90_FULL, Q_in_registers=True).register_estimate() == 192 + 128 // 4
    assert Hopper(FP16, 128, 128, 144, 2, True, True, True, True, True).register_estimate() == 236


GOOD_SM90_CONFIGS = [
    SM90_FULL,
    Hopper(BF16, 64, 64, 192, 4),
    Hopper(FP16, 64, 192, 128, 2, True, True, True),
    Hopper(FP16, 256, 128, 80, 2, True, True, True),
    Hopper(BF16, 192, 128, 112, 2, True, False, True),
    Hopper(FP16, 128, 64, 64, 1, True, False, True),
    Hopper(FP16, 128, 128, 144, 2, True, True, True, True, True),
    Hopper(BF16, 32, 192, 128, 2, True, True, True, True, True),
    Hopper(FP16, 64, 128, 128, 3, True, True, True, False, False, True),
]

# (config, words its reason must contain): each config breaks exactly one rule.
BAD_SM90_CONFIGS = [
    (Hopper(FP16, 72, 128, 128, 2), ["d_head", "32, 48, 64, 80, 96, 128, 160, 192, 224, 256"]),
    (Hopper(FP16, 48, 128, 112, 2), ["B_c * d_head * 2 must be a multiple of 1024", "got B_c = 112 and d_head = 48"]),
    (Hopper(BF16, 80, 128, 176, 2), ["multiple of 1024", "(28160 bytes)"]),
    (Hopper(FP16, 128, 256, 128, 2), ["B_r"]),
    (Hopper(FP16, 128, 128, 72, 2), ["B_c"]),
    (Hopper(FP16, 128, 128, 128, 5), ["stages"]),
    (Hopper(FP16, 128, 128, 128, 2, False, True), ["pingpong", "warp_specialized"]),
    (Hopper(FP16, 128, 64, 128, 2, True, True), ["pingpong", "B_r = 64", "2 consumer warpgroups"]),
    (Hopper(FP16, 256, 128, 128, 2, True), ["shared memory", "328816", str(MAX_SMEM_BYTES)]),
    (Hopper(FP16, 128, 64, 128, 4), ["shared memory", str(MAX_SMEM_BYTES)]),
    (Hopper(FP16, 256, 192, 64, 2, True), ["registers", "208", "160", "3 consumer warpgroup(s)", "producer"]),
    (Hopper(FP16, 256, 192, 64, 2), ["registers", "208", "168"]),
    (Hopper(FP16, 128, 128, 128, 2, persistent=True), ["persistent", "warp_specialized"]),
    (Hopper(FP16, 128, 128, 176, 2, True, True, True, True), ["shared memory", "O when persistent"]),
    (Hopper(FP16, 128, 128, 160, 2, True, True, True, True, True), ["registers", "248", "d_head / 4 for Q", "240"]),
    (Hopper(FP16, 128, 128, 128, 2, multicast=True), ["multicast", "warp_specialized", "both blocks"]),
]


@pytest.mark.parametrize("cfg", GOOD_SM90_CONFIGS, ids=Hopper.short_form)
def test_good_hopper_configs_are_valid(cfg):
    assert cfg.validity_error() is None
    cfg.validate()


@pytest.mark.parametrize(("cfg", "words"), BAD_SM90_CONFIGS, ids=[cfg.short_form() for cfg, _ in BAD_SM90_CONFIGS])
def test_bad_hopper_configs_are_rejected_with_a_reason(cfg, words):
    reason = cfg.validity_error()
    assert reason is not None and reason.endswith(".")
    for word in words:
        assert word in reason
    with pytest.raises(ValueError) as error:
        cfg.validate()
    assert str(error.value) == reason


def test_hopper_registers_make_no_exception_for_producer_less_kernels():
    """Without warp specialization every thread computes; the budget is the register file shared."""
    cfg = Hopper(FP16, 256, 192, 64, 2)
    assert "producer" not in cfg.validity_error()


@pytest.mark.parametrize(
    ("capability", "runs"), [((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), False), ((12, 0), False)]
)
def test_hopper_runs_on_sm90_only(capability, runs):
    assert SM90_FULL.runs_on(capability) is runs


def test_only_the_sm80_family_runs_a_smaller_head_size_with_masked_tails():
    sm80 = Config(FP16, 96, 128, 32, 4, True)
    assert not sm80.needs_masked_tails(512, 512) and not sm80.needs_masked_tails(512, 512, d_head=96)
    assert sm80.needs_masked_tails(512, 512, d_head=80)
    assert not SM90_FULL.needs_masked_tails(512, 512, d_head=SM90_FULL.d_head - 8)
    assert needed_variant(sm80, 512, 512, d_head=80) == ProblemVariant(MaskKind.NONE, True)
    assert needed_variant(sm80, 512, 512) == ProblemVariant(MaskKind.NONE)


@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k", "tails"),
    [(256, 256, False), (128, 1024, False), (257, 256, True), (256, 200, True), (64, 128, True), (1, 1, True)],
)
def test_hopper_needs_masked_tails(seqlen_q, seqlen_k, tails):
    assert SM90_FULL.needs_masked_tails(seqlen_q, seqlen_k) is tails


def test_hopper_all_is_every_valid_config():
    sm90 = of_family(get_all_kernel_configs(), Hopper)
    space = itertools.product(
        (FP16, BF16, E4M3), sm90_config.D_HEADS, sm90_config.B_RS, sm90_config.B_CS, sm90_config.STAGES, *[(False, True)] * 8
    )
    assert sm90 == sorted(cfg for cfg in itertools.starmap(Hopper, space) if cfg.is_valid())
    for cfg in GOOD_SM90_CONFIGS:
        assert cfg in sm90


def test_hopper_tune_overlaps_everything_at_two_stages():
    tune = of_family(get_autotuning_kernel_configs(), Hopper)
    expected = [
        cfg
        for cfg in of_family(get_all_kernel_configs(), Hopper)
        if cfg.dtype != E4M3  # the sweeps measure 16-bit inputs
        and cfg.warp_specialized and cfg.pingpong and cfg.intra_wg_overlap and cfg.B_r in (128, 192) and cfg.stages == 2
        # multicast only on persistent 128-row blocks at d_head 64 and 128
        and (not cfg.multicast or (cfg.persistent and cfg.B_r == 128 and cfg.d_head in (64, 128)))
        and not cfg.deferred_O_rescale  # measured against its twin instead
    ]
    assert tune == expected
    assert any(cfg.multicast for cfg in tune)
    assert {cfg.d_head for cfg in tune} == set(sm90_config.D_HEADS)
    assert {cfg.B_r for cfg in tune} == {128, 192}
    assert not should_autotune_config(dataclasses.replace(SM90_FULL, stages=3))
    assert not should_autotune_config(dataclasses.replace(SM90_FULL, intra_wg_overlap=False))
    assert of_family(get_autotuning_kernel_configs(dtypes=(BF16,), d_heads=(256,)), Hopper) == [
        cfg for cfg in tune if (cfg.dtype, cfg.d_head) == (BF16, 256)
    ]


def test_hopper_progression_steps_in_order():
    names = [name for name, _ in SM90_PROGRESSION_STEPS]
    assert names == ["hopper_base", "hopper_ws", "hopper_pingpong", "hopper_overlap", "hopper_persistent", "hopper_qregs"]
    prog = of_family(get_kernel_progression_configs(), Hopper)
    for dtype in (FP16, BF16):
        head = "sm90({}, 128, {}, {}, {})".format(dtype.name, *SM90_PROGRESSION_BLOCK)
        steps = [
            parse_kernel_name_into_config(f"{head}: {flags}" if flags else head) for _, flags in SM90_PROGRESSION_STEPS
        ]
        assert [cfg for cfg in prog if cfg.dtype == dtype] == steps  # each step adds a flag: they sort in order
    assert steps[0] == Hopper(BF16, 128, 128, 128, 2) and steps[-3] == dataclasses.replace(SM90_FULL, dtype=BF16)
    assert steps[-2] == dataclasses.replace(SM90_FULL, dtype=BF16, persistent=True)
    assert steps[-1] == dataclasses.replace(SM90_FULL, dtype=BF16, persistent=True, Q_in_registers=True)


def test_hopper_progall_covers_every_valid_block_at_two_stages():
    progall = of_family(get_kernel_progression_configs(all_block_sizes=True), Hopper)
    assert set(of_family(get_kernel_progression_configs(), Hopper)) <= set(progall)
    blocks = itertools.product(sm90_config.B_RS, sm90_config.B_CS)
    # The base step needs the fewest registers: a block size has some step exactly when it has that one.
    assert {(cfg.B_r, cfg.B_c) for cfg in progall} == {block for block in blocks if Hopper(FP16, 128, *block, 2).is_valid()}
    assert {(cfg.d_head, cfg.stages) for cfg in progall} == {(128, 2)}
    assert not any(cfg.pingpong for cfg in progall if cfg.B_r == 64)  # invalid there: skipped


def test_default_set_has_the_hopper_configurations():
    sm90 = of_family(get_kernels_to_build("default"), Hopper)
    sixteen_bit = {(dtype, d) for dtype in (FP16, BF16) for d in sm90_config.D_HEADS if d != 80}  # 80 runs on 96's
    assert {(cfg.dtype, cfg.d_head) for cfg in sm90} == sixteen_bit | {(E4M3, 64), (E4M3, 128), (E4M3, 256)}
    assert all(cfg.warp_specialized for cfg in sm90)
    # Every one takes turns between its consumer warpgroups but d_head 64's e4m3 three (and their vtcopy version),
    # which measured faster without.
    d64_e4m3 = parse_kernel_name_into_config(E4M3_DEFAULTS[0])
    assert [cfg for cfg in sm90 if not cfg.pingpong] == [d64_e4m3, dataclasses.replace(d64_e4m3, V_transposed_copy=True)]
    # Every one overlaps within its warpgroups but d_head 256's e4m3 128-key tiles, which measured faster without.
    assert [cfg for cfg in sm90 if not cfg.intra_wg_overlap] == [parse_kernel_name_into_config(E4M3_DENSE_ONLY)]
    assert sm90 == sorted(parse_kernel_name_into_config(text) for text in DEFAULT_BUILD_KERNELS if text.startswith("sm90("))


# ----------------------------------------------------------------------------------------------
# The Hopper family's e4m3 (FP8) configurations

E4M3_DEFAULTS = [
    "sm90(E4M3, 64, 192, 128, 2): ws+overlap",
    "sm90(E4M3, 128, 128, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(E4M3, 128, 128, 192, 2): ws+pingpong+overlap+persistent",
    "sm90(E4M3, 256, 128, 128, 2): ws+pingpong",
    "sm90(E4M3, 256, 128, 64, 2): ws+pingpong+overlap",
    "sm90(E4M3, 64, 192, 128, 2): ws+overlap+vtcopy",
    "sm90(E4M3, 128, 128, 192, 2): ws+pingpong+overlap+persistent+vtcopy",
    "sm90(E4M3, 256, 128, 128, 2): ws+pingpong+overlap+vtcopy",
]
# The one the varlen calls of its dtype and head size do not run: its consumers would spill at a varlen
# kernel's registers.
E4M3_DENSE_ONLY = E4M3_DEFAULTS[3]
# Those whose V a copy kernel transposes: dense calls alone.
E4M3_COPIES = E4M3_DEFAULTS[5:]
E4M3_FULL = Hopper(E4M3, 128, 128, 128, 2, True, True, True)


def test_the_default_set_has_the_e4m3_configurations_with_their_varlen_kernels():
    default = get_kernels_to_build("default")
    assert [cfg for cfg in default if cfg.dtype == E4M3] == sorted(map(parse_kernel_name_into_config, E4M3_DEFAULTS))
    # Each with its varlen variants (the decoding configurations are the SM80 family's, 16-bit q).
    varlen = [parse_kernel_name_into_config(text) for text in VARLEN_KERNELS if "E4M3" in text]
    assert sorted(varlen) == sorted(
        parse_kernel_name_into_config(text) for text in E4M3_DEFAULTS if text != E4M3_DENSE_ONLY and text not in E4M3_COPIES
    )
    assert parse_kernel_name_into_config(E4M3_DENSE_ONLY).register_estimate() > sm90_config.VARLEN_CONSUMER_REGISTERS
    assert not any(parse_kernel_name_into_config(text).dtype == E4M3 for text in DECODE_KERNELS)


@pytest.mark.parametrize("text", E4M3_DEFAULTS)
def test_e4m3_configurations_round_trip_through_their_textual_forms(text):
    cfg = parse_kernel_name_into_config(text)
    assert cfg.dtype is E4M3 and cfg.short_form() == text
    for form in (cfg.short_form(), cfg.demangled_kernel_name(), cfg.to_cpp_struct(), cfg.short_form().replace("E4M3", "fp8")):
        assert parse_kernel_name_into_config(form) == cfg, form


def test_e4m3_names():
    assert E4M3_FULL.short_form() == "sm90(E4M3, 128, 128, 128, 2): ws+pingpong+overlap"
    assert E4M3_FULL.file_stem() == "e4m3_d128_br128_bc128_s2_ws_pingpong_overlap"
    assert E4M3_FULL.to_cpp_struct() == (
        "HopperForwardKernelConfig{DType::E4M3, 128, 128, 128, 2, true, true, true, false, false, false, false, false}"
    )
    assert E4M3_FULL.demangled_kernel_name() == (
        "void flash::sm90::hopper_forward_kernel<flash::sm90::StaticHopperKernelConfig<"
        "flash::sm90::HopperForwardKernelConfig{(flash::DType)24, 128, 128, 128, 2, true, true, true, false, false, false, false, false}>, "
        "(flash::MaskKind)0, false, false, false, false>(flash::sm90::KernelParams)"
    )
    # The enum's value, 24, spelled as the mangling spells FP16's 5 and BF16's 15 (test_hopper_mangled_kernel_name).
    assert E4M3_FULL.mangled_kernel_name() == (
        "_ZN5flash4sm9021hopper_forward_kernelINS0_24StaticHopperKernelConfigIXtlNS0_25HopperForwardKernelConfigE"
        "LNS_5DTypeE24ELi128ELi128ELi128ELi2ELb1ELb1ELb1ELb0ELb0ELb0ELb0ELb0EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS0_12KernelParamsE"
    )
    assert parse_kernel_name_into_config("HopperForwardKernelConfig{24, 128, 128, 128, 2, 1, 1, 1}") == E4M3_FULL


@pytest.mark.parametrize(
    ("text", "smem_bytes"),
    [
        # Q (B_r x d_head bytes); per stage K, V and V transposed (B_c x d_head bytes each); O (B_r x d_head x 2
        # bytes) in a tile of its own when persistent or when the stages' V tiles cannot hold it, else in them;
        # 1024 bytes of alignment slack; 8-byte words: Q full and empty per consumer warpgroup (2 x 2), K, V and
        # V transposed full and empty per stage (6 x 2), a work slot of 1 word per consumer warpgroup (1 x 2)
        # and the end of the V stream (an int per stage, in 2 words): 20 words.
        ("sm90(E4M3, 64, 128, 128, 2): ws+pingpong+overlap", 128 * 64 + 2 * 3 * 128 * 64 + 1024 + 8 * 20),
        (E4M3_DEFAULTS[1], 128 * 128 + 2 * 3 * 128 * 128 + 128 * 128 * 2 + 1024 + 8 * 20),
        (E4M3_DEFAULTS[2], 128 * 128 + 2 * 3 * 192 * 128 + 128 * 128 * 2 + 1024 + 8 * 20),
        (E4M3_FULL.short_form(), 128 * 128 + 2 * 3 * 128 * 128 + 1024 + 8 * 20),
        # Two stages of 64 keys hold half of O: it takes a tile of its own.
        (E4M3_DEFAULTS[4], 128 * 256 + 2 * 3 * 64 * 256 + 128 * 256 * 2 + 1024 + 8 * 20),
        (E4M3_DEFAULTS[3], 128 * 256 + 2 * 3 * 128 * 256 + 1024 + 8 * 20),
        # 224 keys: the transposed V tile's rows are four 64-byte swizzle rows, 256 bytes.
        (
            "sm90(E4M3, 128, 128, 224, 2): ws+pingpong+overlap+persistent",
            128 * 128 + 2 * 2 * 224 * 128 + 2 * 256 * 128 + 128 * 128 * 2 + 1024 + 8 * 20,
        ),
    ],
)
def test_e4m3_smem_bytes(text, smem_bytes):
    # 58528 to 230560 bytes: all fit sm_90's 232448.
    assert parse_kernel_name_into_config(text).smem_bytes() == smem_bytes <= MAX_SMEM_BYTES


@pytest.mark.parametrize(("B_c", "row_bytes"), [(64, 64), (96, 128), (128, 128), (160, 192), (192, 192), (224, 256)])
def test_e4m3_transposed_v_rows_are_whole_swizzle_rows(B_c, row_bytes):
    # 128-byte swizzle rows where B_c is a multiple of 128 keys, else 64-byte ones, the last part filled.
    assert Hopper(E4M3, 128, 128, B_c, 2, True, True, True).transposed_v_row_bytes() == row_bytes


def test_e4m3_smem_bytes_of_three_consumer_warpgroups_and_three_stages():
    cfg = Hopper(E4M3, 64, 192, 64, 3, True, True, True)
    words = 2 * 3 + 6 * 3 + 1 * 3 + 2
    assert cfg.smem_bytes() == 192 * 64 + 3 * 3 * 64 * 64 + 192 * 64 * 2 + 1024 + 8 * words


def test_e4m3_registers():
    # P as four 8-bit values per register: B_c / 8.
    assert E4M3_FULL.register_estimate() == 128 // 2 + 128 // 2 + 128 // 8 + 32 == 176
    assert Hopper(E4M3, 256, 128, 128, 2, True, True).register_estimate() == 64 + 128 + 16 + 32 == 240
    # Where the consumers can spare them, the producer warpgroup keeps 56 registers and transposes V by
    # rows: two consumer warpgroups get 224 each, three 152.
    assert E4M3_FULL.transposes_v_by_rows and E4M3_FULL.consumer_registers() == 224
    three = Hopper(E4M3, 64, 192, 128, 2, True, True, True)
    assert three.transposes_v_by_rows and three.consumer_registers() == 152
    # Elsewhere it transposes by matrices in as few registers as its loading warp, and the consumers get
    # what they do with 16-bit inputs, 240 (d_head 256's 128-key tiles need all of them).
    wide = parse_kernel_name_into_config(E4M3_DENSE_ONLY)
    assert wide.register_estimate() == 240 and not wide.transposes_v_by_rows and wide.consumer_registers() == 240
    assert not Hopper(E4M3, 128, 128, 224, 2, True, True, True).transposes_v_by_rows
    # One consumer warpgroup has every register the launch bound leaves; 16-bit inputs transpose nothing.
    assert Hopper(E4M3, 128, 64, 128, 2, True).transposes_v_by_rows
    assert not dataclasses.replace(E4M3_FULL, dtype=BF16).transposes_v_by_rows


def test_e4m3_O_goes_out_through_the_V_tiles_of_a_single_pass_that_hold_it():
    assert E4M3_FULL.o_in_v_tiles
    assert parse_kernel_name_into_config(E4M3_DEFAULTS[3]).o_in_v_tiles
    # Persistent: the next work tile's V tiles load while O is stored.
    assert not parse_kernel_name_into_config(E4M3_DEFAULTS[1]).o_in_v_tiles
    # Two stages of 64 keys hold one of two consumer warpgroups' O blocks; three of 128, two of three.
    assert not Hopper(E4M3, 256, 128, 64, 2, True, True, True).o_in_v_tiles
    assert not Hopper(E4M3, 64, 192, 128, 2, True, True, True).o_in_v_tiles
    assert Hopper(E4M3, 64, 192, 128, 3, True, True, True).o_in_v_tiles
    # 16-bit O goes out through Q's blocks.
    assert not dataclasses.replace(E4M3_FULL, dtype=BF16).o_in_v_tiles


E4M3_COPY = Hopper(E4M3, 256, 128, 128, 2, True, True, V_transposed_copy=True)


def test_e4m3_V_transposed_copy_flag():
    """vtcopy: its spellings (the symbol's last field as read off an sm_90a object nvcc 13 compiled),
    and the block it makes: V's tile is the transposed one, so no transposed tile, no barriers of its own
    and no end of a V stream; O takes a block of its own (no warps have read the V tiles for it)."""
    cfg = E4M3_COPY
    assert cfg.short_form() == "sm90(E4M3, 256, 128, 128, 2): ws+pingpong+vtcopy"
    assert parse_kernel_name_into_config("sm90(E4M3, 256, 128, 128, 2): vtcopy+pingpong+ws") == cfg
    assert cfg.file_stem() == "e4m3_d256_br128_bc128_s2_ws_pingpong_vtcopy"
    assert cfg.to_cpp_struct().endswith("true, true, false, false, false, false, true, false}")
    assert cfg.mangled_kernel_name().endswith(
        "ELi2ELb1ELb1ELb0ELb0ELb0ELb0ELb1ELb0EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS0_12KernelParamsE"
    )
    assert cfg.validity_error() is None
    assert not cfg.transposes_v and not cfg.transposes_v_by_rows and not cfg.o_in_v_tiles
    words = 2 * 2 + 4 * 2 + 2  # Q's barriers, K's and V's per stage, the work slots
    assert cfg.smem_bytes() == 128 * 256 + 2 * 2 * 128 * 256 + 128 * 256 * 2 + 1024 + 8 * words <= MAX_SMEM_BYTES
    assert cfg.consumer_registers() == 240 and cfg.producer_registers() == 24
    # Its kernels are the dense variants': the copy's key groups are one sequence's.
    assert all(not variant.varlen for variant in variants_to_build(cfg))
    sm90_varlen = [parse_kernel_name_into_config(text) for text in VARLEN_KERNELS if text.startswith("sm90(")]
    assert not any(other.V_transposed_copy for other in sm90_varlen)


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        (dataclasses.replace(E4M3_COPY, dtype=BF16), ["V_transposed_copy is for e4m3"]),
        (dataclasses.replace(E4M3_COPY, d_head=128, B_c=96), ["B_c a multiple of 64", "got B_c = 96"]),
        (dataclasses.replace(E4M3_COPY, stages=3), ["shared memory", "a K and a transposed V tile per stage, O"]),
    ],
    ids=["bf16", "B_c 96", "three stages"],
)
def test_bad_V_transposed_copy_configs_are_rejected_with_a_reason(cfg, words):
    reason = cfg.validity_error()
    assert reason is not None and reason.endswith(".")
    for word in words:
        assert word in reason, reason


GOOD_E4M3_CONFIGS = [
    *map(parse_kernel_name_into_config, E4M3_DEFAULTS),
    Hopper(E4M3, 64, 192, 128, 2, True, True, True),
    Hopper(E4M3, 192, 128, 64, 2, True, True, True, True),
    Hopper(E4M3, 128, 128, 64, 4, True),
    # One consumer warpgroup: the launch bound leaves every thread its registers.
    Hopper(E4M3, 128, 64, 128, 2, True),
    # Transposed V tiles whose last 64-byte column block is part filled.
    Hopper(E4M3, 128, 128, 96, 2, True, True, True),
    Hopper(E4M3, 128, 128, 160, 2, True, True, True),
    Hopper(E4M3, 128, 128, 224, 2, True, True, True, True),
]

# (config, words its reason must contain): each breaks exactly one rule.
BAD_E4M3_CONFIGS = [
    (Hopper(E4M3, 128, 128, 128, 2), ["e4m3 needs warp_specialized", "K-major", "transposes each V tile"]),
    (dataclasses.replace(E4M3_FULL, persistent=True, Q_in_registers=True), ["e4m3 needs Q_in_registers off"]),
    (dataclasses.replace(E4M3_FULL, persistent=True, multicast=True), ["e4m3 needs multicast off"]),
    (Hopper(E4M3, 128, 128, 80, 2, True, True, True), ["e4m3 needs B_c a multiple of 32", "k-slices", "got B_c = 80"]),
    (Hopper(E4M3, 128, 128, 176, 2, True, True, True), ["e4m3 needs B_c a multiple of 32", "got B_c = 176"]),
    (Hopper(E4M3, 96, 128, 128, 2, True, True, True), ["multiple of 64 (64, 128, 192, 256)", "got d_head = 96"]),
    (Hopper(E4M3, 32, 128, 128, 2, True, True, True), ["multiple of 64", "got d_head = 32"]),
    (Hopper(E4M3, 256, 128, 128, 2, True, True, True, True), ["shared memory", "transposed V", str(MAX_SMEM_BYTES)]),
    (Hopper(E4M3, 256, 192, 64, 1, True, True, True), ["registers", "200", "B_c / 8 for P", "160"]),
]


@pytest.mark.parametrize("cfg", GOOD_E4M3_CONFIGS, ids=Hopper.short_form)
def test_good_e4m3_configs_are_valid(cfg):
    assert cfg.validity_error() is None


@pytest.mark.parametrize(("cfg", "words"), BAD_E4M3_CONFIGS, ids=[cfg.short_form() for cfg, _ in BAD_E4M3_CONFIGS])
def test_bad_e4m3_configs_are_rejected_with_a_reason(cfg, words):
    reason = cfg.validity_error()
    assert reason is not None and reason.endswith(".")
    for word in words:
        assert word in reason, reason
    # The same configuration of a 16-bit dtype breaks no e4m3 rule.
    assert "e4m3" not in (dataclasses.replace(cfg, dtype=BF16).validity_error() or "")


def test_e4m3_is_in_all_but_in_no_sweep():
    all_e4m3 = [cfg for cfg in get_all_kernel_configs() if cfg.dtype == E4M3]
    assert all_e4m3 and all(cfg.family == "sm90" for cfg in all_e4m3)
    assert {cfg.B_c for cfg in all_e4m3} == {64, 96, 128, 160, 192, 224} and {cfg.d_head for cfg in all_e4m3} == {64, 128, 192, 256}
    assert not any(cfg.dtype == E4M3 for cfg in get_kernel_configs("tune") + get_kernel_configs("progall"))
    assert not should_autotune_config(E4M3_FULL)


def test_short_form_keys_may_mix_families():
    sm80, sm90 = "(FP16, 128, 64, 64, 4): async", "sm90(BF16, 64, 64, 96, 1)"
    expected = [Config(FP16, 128, 64, 64, 4, True), Hopper(BF16, 64, 64, 96, 1)]
    assert get_kernel_configs(f"{sm90}; {sm80};{sm90}") == expected
    with pytest.raises(ValueError, match="not a valid configuration.*pingpong needs warp_specialized"):
        get_kernel_configs(f"{sm80}; sm90(FP16, 128, 128, 128, 2): pingpong")


# ----------------------------------------------------------------------------------------------
# Architectures of the build


@pytest.mark.parametrize(
    ("arch_list", "with_sm90"),
    [
        ("8.0", False),
        ("9.0", True),
        ("8.0;9.0", True),
        ("9.0a", True),
        ("9.0+PTX", True),
        ("9.0a+PTX", True),
        ("8.0 9.0", True),
        ("8.0 8.6+PTX", False),
        ("8.0;8.9;10.0", False),
        ("19.0;9.05", False),
    ],
)
def test_hopper_is_built_only_for_an_arch_list_with_sm90(arch_list, with_sm90):
    assert sm90_in_arch_list(arch_list) is with_sm90
    for key in ("default", "tune", "prog", "default+prog"):
        everything = get_kernels_to_build(key, "9.0")
        built = get_kernels_to_build(key, arch_list)
        assert built == (everything if with_sm90 else of_family(everything, Config)), key
        assert of_family(built, Config) == of_family(everything, Config)


def test_arch_list_comes_from_the_environment(monkeypatch):
    assert resolve_arch_list() == DEFAULT_ARCH_LIST == "8.0;9.0"
    assert of_family(get_kernels_to_build(), Hopper)
    monkeypatch.setenv(ARCH_LIST_ENV, "8.0")
    assert resolve_arch_list() == "8.0"
    assert of_family(get_kernels_to_build(), Hopper) == []
    assert resolve_arch_list("9.0a") == "9.0a"
    assert of_family(get_kernels_to_build(arch_list="9.0a"), Hopper)


@pytest.mark.parametrize(
    ("key", "count"),
    [
        ("sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap", 1),
        ("(FP16, 128, 64, 64, 4); sm90(FP16, 128, 128, 128, 2)", 1),
        ("sm90(FP16, 128, 128, 128, 2); sm90(BF16, 64, 64, 96, 1)", 2),
        ("HopperForwardKernelConfig{DType::FP16, 128, 128, 128, 2, true, true, true, false}", 1),
    ],
)
def test_hopper_short_forms_without_sm90_in_the_arch_list_are_an_error(key, count):
    with pytest.raises(ValueError) as error:
        get_kernels_to_build(key, "8.0")
    message = str(error.value)
    for words in (f"{count} Hopper configuration", "sm_90a", "'8.0'", f"add 9.0 to {ARCH_LIST_ENV}"):
        assert words in message
    assert len(of_family(get_kernels_to_build(key, "8.0;9.0"), Hopper)) == count


def test_sm80_short_forms_build_without_sm90():
    assert get_kernels_to_build("(FP16, 128, 64, 64, 4): async", "8.0") == [Config(FP16, 128, 64, 64, 4, True)]


@pytest.mark.parametrize(
    ("arch_list", "for_build"),
    [
        ("9.0", "9.0a"),
        ("8.0;9.0", "8.0;9.0a"),
        ("9.0a", "9.0a"),
        ("9.0+PTX", "9.0a+PTX"),
        ("9.0a+PTX", "9.0a+PTX"),
        ("8.0 8.6+PTX 9.0", "8.0 8.6+PTX 9.0a"),
        ("8.0;8.6+PTX", "8.0;8.6+PTX"),
        ("9.0;10.0", "9.0a;10.0"),
        ("19.0;9.05", "19.0;9.05"),
    ],
)
def test_arch_list_for_build_compiles_sm90_as_sm90a(arch_list, for_build):
    assert arch_list_for_build(arch_list) == for_build
    assert sm90_in_arch_list(for_build) == sm90_in_arch_list(arch_list)


@pytest.mark.parametrize(
    "arch_list, flags",
    [
        ("9.0a", ["-gencode=arch=compute_90a,code=compute_90a"]),
        ("8.0;9.0a", ["-gencode=arch=compute_80,code=compute_80", "-gencode=arch=compute_90a,code=compute_90a"]),
        ("8.0 8.6+PTX", ["-gencode=arch=compute_80,code=compute_80", "-gencode=arch=compute_86,code=compute_86"]),
    ],
)
def test_ptx_only_builds_pass_nvcc_ptx_targets_of_the_list(arch_list, flags):
    assert ptx_only_gencode_flags(arch_list, {PTX_ONLY_ENV: "1"}) == flags
    # Unset or 0: no flags, and torch's builder adds machine code for the list.
    assert ptx_only_gencode_flags(arch_list, {}) == []
    assert ptx_only_gencode_flags(arch_list, {PTX_ONLY_ENV: "0"}) == []


def test_a_ptx_only_build_names_an_entry_it_cannot_read():
    with pytest.raises(ValueError, match=r"TORCH_CUDA_ARCH_LIST: 'Hopper' is not an architecture"):
        ptx_only_gencode_flags("Hopper", {PTX_ONLY_ENV: "1"})


def test_rebuild_hint_names_both_variables():
    assert BUILD_KERNELS_ENV in REBUILD_HINT and ARCH_LIST_ENV in REBUILD_HINT and "9.0" in REBUILD_HINT
