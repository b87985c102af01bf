"""Tests of the forward pass: results against a float32 reference, how q, k, v and o are read and
written, stream and device handling, and the checks that reject bad arguments.

GPU tests (marked ``gpu``) run once per compiled configuration, or per compiled configuration that
the KERNELS environment variable selects. The tests at the end need no GPU, only the built module.
"""

import dataclasses
import functools
import math
import importlib.machinery
import importlib.util
import os
import pathlib
import subprocess
import sys
import types
import warnings
from collections.abc import Callable
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")


def _extension_is_built() -> bool:
    """Whether a compiled flash_attention._C exists, found without importing the package (whose
    import needs it). A missing build skips these tests; a build that fails to import fails them."""
    spec = importlib.util.find_spec("flash_attention")
    locations = (spec.submodule_search_locations or []) if spec else []
    return any(
        pathlib.Path(location, "_C" + suffix).exists()
        for location in locations
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


if not _extension_is_built():
    pytest.skip(
        "flash_attention._C is not built: run `bash tools/test.sh` or `pip install --no-build-isolation -e .`",
        allow_module_level=True,
    )

import flash_attention  # noqa: E402
from flash_attention import _C  # noqa: E402
from flash_helpers.reference import FloatReference  # noqa: E402
from flash_helpers.kernel_sets import (  # noqa: E402
    KERNELS_ENV,
    get_all_kernel_configs,
    get_kernel_configs,
    get_kernels_to_build,
)
from flash_helpers.sm80_config import FlashForwardKernelConfig  # noqa: E402

gpu = pytest.mark.gpu

# GPU clock cycles the stream test keeps its stream busy for (about 10 ms): far longer than the
# time it takes to queue the kernel behind it.
STREAM_BUSY_CYCLES = 20_000_000


def _configs_under_test() -> list[FlashForwardKernelConfig]:
    """The compiled configurations, restricted to those KERNELS selects when it is set."""
    compiled = flash_attention.compiled_configs()
    if not os.environ.get(KERNELS_ENV):
        return compiled
    selected = set(get_kernel_configs())
    missing = selected - set(compiled)
    if missing:
        warnings.warn(
            f"{len(missing)} configurations selected by {KERNELS_ENV}={os.environ[KERNELS_ENV]!r} are not compiled "
            f"into this build (kernel set {flash_attention.compiled_kernel_set()!r}) and are not tested; "
            "build them with FLASH_BUILD_KERNELS",
            stacklevel=1,
        )
    return [cfg for cfg in compiled if cfg in selected]


CONFIGS = _configs_under_test()
each_config = pytest.mark.parametrize("cfg", CONFIGS, ids=FlashForwardKernelConfig.short_form)


def smallest_seq_len(cfg: FlashForwardKernelConfig) -> int:
    # Block sizes are powers of two, so the larger one is a multiple of the smaller.
    return max(cfg.B_r, cfg.B_c)


def reference_shapes(cfg: FlashForwardKernelConfig) -> list[tuple[int, int, int]]:
    """(batch, heads, seq_len) to check results at: batch and heads not powers of two, seq_len from
    one block up to 16384, including an odd number of blocks and a grid larger than the GPU."""
    block = smallest_seq_len(cfg)
    return [(1, 1, block), (3, 5, block), (3, 5, 3 * block), (5, 3, 2048), (1, 2, 16384)]


# ----------------------------------------------------------------------------------------------
# Inputs and the reference


@pytest.fixture
def rng(seed) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def random_qkv(cfg, batch, heads, seq_len, rng) -> list[torch.Tensor]:
    shape = (batch, seq_len, heads, cfg.d_head)
    dtype = cfg.dtype.to_torch_dtype()
    return [torch.randn(shape, generator=rng, device=rng.device, dtype=dtype) for _ in range(3)]


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer poisoned with NaN, so any element the kernel fails to write shows."""
    return torch.full_like(t, float("nan"))


def assert_matches_reference(out, q, k, v) -> None:
    comparison = FloatReference(q, k, v).compare(out)
    assert comparison.passed, (
        f"output differs from the float32 reference: max error {comparison.max_error:.3g} "
        f"(allowed {comparison.tolerance:.3g}), relative norm error {comparison.relative_norm_error:.3g} (allowed 1e-2)"
    )


# ----------------------------------------------------------------------------------------------
# Results


@gpu
@pytest.mark.parametrize(
    "cfg, shape",
    [
        pytest.param(cfg, shape, id=f"{cfg.short_form()}-b{shape[0]}_h{shape[1]}_s{shape[2]}")
        for cfg in CONFIGS
        for shape in reference_shapes(cfg)
    ],
)
def test_matches_reference(cfg, shape, rng):
    q, k, v = random_qkv(cfg, *shape, rng)
    o = nan_like(q)
    out = flash_attention.forward(cfg, q, k, v, o)
    assert out.data_ptr() == o.data_ptr(), "forward must return the o it was given"
    assert not out.isnan().any(), "some output elements were not written"
    assert_matches_reference(out, q, k, v)


def ramped_keys(k: torch.Tensor, first: float, last: float) -> torch.Tensor:
    """k with its rows scaled geometrically from ``first`` to ``last`` along the sequence."""
    factors = torch.logspace(math.log2(first), math.log2(last), k.shape[1], base=2, device=k.device)
    return (k.float() * factors[None, :, None, None]).to(k.dtype)


@gpu
@each_config
@pytest.mark.parametrize("ramp", [(0.25, 8.0), (8.0, 0.25)], ids=["growing_keys", "shrinking_keys"])
def test_matches_reference_when_row_maxima_move_far(cfg, ramp, rng):
    """Keys whose scale ramps along the sequence: growing, each row's maximum climbs far beyond
    what one rescaling covers, again and again, so the outputs must be rescaled on many tiles;
    shrinking, the first tile holds the maxima and later tiles' probabilities vanish next to it."""
    q, k, v = random_qkv(cfg, 2, 3, 16 * smallest_seq_len(cfg), rng)
    k = ramped_keys(k, *ramp)
    out = flash_attention.forward(cfg, q, k, v, nan_like(q))
    assert not out.isnan().any(), "some output elements were not written"
    assert_matches_reference(out, q, k, v)


@gpu
@each_config
def test_repeated_calls_are_bitwise_identical(cfg, rng):
    q, k, v = random_qkv(cfg, 3, 5, 3 * smallest_seq_len(cfg), rng)
    first = flash_attention.forward(cfg, q, k, v, nan_like(q))
    second = flash_attention.forward(cfg, q, k, v, nan_like(q))
    assert torch.equal(first, second)


def as_layout(tensors, layout: str) -> list[torch.Tensor]:
    """Copies of (batch, seq, heads, d_head) tensors stored in another layout, seen through views of
    the same shape whose strides differ from the contiguous ones."""
    if layout == "packed":
        # One (batch, seq, n, heads, d_head) tensor, as a fused QKV projection produces.
        return list(torch.stack(tensors, dim=2).unbind(2))
    if layout == "heads_major":
        # (batch, heads, seq, d_head) storage.
        return [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors]
    raise ValueError(f"unknown layout {layout!r}")


@gpu
@pytest.mark.parametrize("layout", ["packed", "heads_major"])
@each_config
def test_strided_tensors_give_the_contiguous_result(cfg, layout, rng):
    q, k, v = random_qkv(cfg, 3, 5, 3 * smallest_seq_len(cfg), rng)
    expected = flash_attention.forward(cfg, q, k, v)
    strided_q, strided_k, strided_v = as_layout([q, k, v], layout)
    # o is the middle of three slots: the kernel must write all of it and nothing next to it.
    before, o, after = as_layout([nan_like(q)] * 3, layout)
    assert not any(t.is_contiguous() for t in (strided_q, strided_k, strided_v, o))
    out = flash_attention.forward(cfg, strided_q, strided_k, strided_v, o)
    assert out.data_ptr() == o.data_ptr()
    assert torch.equal(out, expected)
    assert before.isnan().all() and after.isnan().all(), "the kernel wrote outside o"


@gpu
@each_config
def test_output_allocated_when_not_given(cfg, rng):
    q, k, v = random_qkv(cfg, 3, 5, smallest_seq_len(cfg), rng)
    out = flash_attention.forward(cfg, q, k, v)
    assert (out.shape, out.dtype, out.device) == (q.shape, q.dtype, q.device)
    assert torch.equal(out, flash_attention.forward(cfg, q, k, v, nan_like(q)))


@gpu
@each_config
def test_config_given_as_short_form(cfg, rng):
    q, k, v = random_qkv(cfg, 3, 5, smallest_seq_len(cfg), rng)
    assert torch.equal(flash_attention.forward(cfg.short_form(), q, k, v), flash_attention.forward(cfg, q, k, v))


@gpu
@each_config
def test_forward_timed(cfg, rng):
    q, k, v = random_qkv(cfg, 3, 5, 3 * smallest_seq_len(cfg), rng)
    o = nan_like(q)
    out, runtime_ms = flash_attention.forward_timed(cfg, q, k, v, o)
    assert isinstance(runtime_ms, float) and runtime_ms > 0
    assert out.data_ptr() == o.data_ptr()
    assert torch.equal(out, flash_attention.forward(cfg, q, k, v))


@gpu
@each_config
def test_kernel_attributes(cfg):
    attributes = flash_attention.kernel_attributes(cfg)
    assert set(attributes) == {
        "registers",
        "local_bytes",
        "static_smem_bytes",
        "dynamic_smem_bytes",
        "max_threads_per_block",
    }
    # The Q tile, and a K and a V tile per stage (two with eager loads), of 2-byte elements.
    stages = 2 if cfg.eager_load_blocks else 1
    assert attributes["dynamic_smem_bytes"] == (cfg.B_r + 2 * stages * cfg.B_c) * cfg.d_head * 2
    assert 0 < attributes["registers"] <= 255
    assert attributes["max_threads_per_block"] >= 32 * cfg.n_warps, "the kernel cannot launch with n_warps warps"


@gpu
@each_config
def test_empty_batch(cfg):
    shape = (0, smallest_seq_len(cfg), 3, cfg.d_head)
    q, k, v, o = (torch.empty(shape, dtype=cfg.dtype.to_torch_dtype(), device="cuda") for _ in range(4))
    assert flash_attention.forward(cfg, q, k, v).shape == shape
    assert flash_attention.forward(cfg, q, k, v, o).shape == shape


@gpu
@each_config
def test_runs_on_the_current_stream(cfg, rng):
    """On a side stream, a busy wait delays the copy that gives q, k and v their values: a kernel
    launched on any stream other than the current one would read the stale values."""
    shape = (3, 5, 3 * smallest_seq_len(cfg))
    fresh = random_qkv(cfg, *shape, rng)
    stale = random_qkv(cfg, *shape, rng)
    o = nan_like(fresh[0])
    # A kernel's first launch loads its module, which can synchronize the device and so hide a
    # launch on the wrong stream: launch it once beforehand.
    flash_attention.forward(cfg, *fresh)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(STREAM_BUSY_CYCLES)
        for target, source in zip(stale, fresh):
            target.copy_(source)
        out = flash_attention.forward(cfg, *stale, o)
    stream.synchronize()
    assert_matches_reference(out, *fresh)


@gpu
def test_runs_on_a_gpu_other_than_the_current_one(valid_call):
    if torch.cuda.device_count() < 2:
        pytest.skip("only one GPU visible: running on another GPU needs two")
    moved = valid_call.map_tensors(lambda t: t.to("cuda:1"))
    with torch.cuda.device(0):
        out = moved.run()
    assert out.device == torch.device("cuda:1")
    assert_matches_reference(out, moved.q, moved.k, moved.v)


# ----------------------------------------------------------------------------------------------
# Rejected arguments: each must raise the documented exception, with a message that starts with
# the argument's name, before anything is launched, and leave CUDA usable for the next call.


@dataclasses.dataclass(frozen=True)
class Call:
    """The arguments of one forward call."""

    cfg: object
    q: object
    k: object
    v: object
    o: object = None

    def run(self):
        return flash_attention.forward(self.cfg, self.q, self.k, self.v, self.o)

    def map_tensors(self, change: Callable) -> "Call":
        return dataclasses.replace(self, q=change(self.q), k=change(self.k), v=change(self.v), o=change(self.o))


def make_call(cfg, rng) -> Call:
    q, k, v = random_qkv(cfg, 2, 3, 2 * smallest_seq_len(cfg), rng)
    return Call(cfg, q, k, v, nan_like(q))


@pytest.fixture
def valid_call(rng) -> Call:
    if not CONFIGS:
        pytest.skip("no configuration under test")
    return make_call(CONFIGS[0], rng)


def assert_rejected(run: Callable, error: type[Exception] | tuple, names: tuple[str, ...], mentioning: str = ""):
    """``run()`` must raise ``error`` with a message that starts with one of ``names`` (an argument,
    or an argument's field as ``kernel_cfg.d_head``) and contains ``mentioning``."""
    with pytest.raises(error) as raised:
        run()
    message = str(raised.value)
    prefixes = tuple(f"{name}:" for name in names)
    assert message.startswith(prefixes), f"the message does not start with {' or '.join(prefixes)}: {message}"
    assert mentioning in message


def assert_still_usable(call: Call) -> None:
    out = call.run()
    torch.cuda.synchronize()
    assert_matches_reference(out, call.q, call.k, call.v)


def other_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.bfloat16 if t.dtype == torch.float16 else torch.float16


def with_other_d_head(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty((*t.shape[:3], 192 - t.shape[3]))  # 64 <-> 128


def view_of_wider(t: torch.Tensor, width: int, columns: slice) -> torch.Tensor:
    """A copy of ``t`` seen through ``columns`` of a (..., width) buffer: controls the data pointer's
    offset, the strides, and the last dimension's stride independently."""
    view = torch.empty((*t.shape[:3], width), dtype=t.dtype, device=t.device)[..., columns]
    return view.copy_(t)


class BadInput(NamedTuple):
    id: str
    error: type[Exception]
    names: tuple[str, ...]  # the message must start with one of these
    change: Callable[[Call], Call]  # turns the valid call into the bad one
    gpus: int = 1


def _replace(**changes: Callable) -> Callable[[Call], Call]:
    """A change that replaces each named argument by a function of the valid call's value."""
    return lambda call: dataclasses.replace(
        call, **{name: change(getattr(call, name)) for name, change in changes.items()}
    )


BAD_INPUTS = [
    BadInput("k_not_a_tensor", TypeError, ("k",), _replace(k=lambda k: k.tolist())),
    BadInput("q_on_cpu", ValueError, ("q",), _replace(q=lambda q: q.cpu())),
    BadInput("all_on_cpu", ValueError, ("q",), lambda call: call.map_tensors(lambda t: t.cpu())),
    BadInput("o_on_cpu", ValueError, ("o",), _replace(o=lambda o: o.cpu())),
    BadInput("k_on_another_gpu", ValueError, ("k",), _replace(k=lambda k: k.to("cuda:1")), gpus=2),
    BadInput("float32", TypeError, ("q",), lambda call: call.map_tensors(lambda t: t.float())),
    BadInput("v_dtype_differs", TypeError, ("v",), _replace(v=lambda v: v.to(other_dtype(v)))),
    BadInput("o_dtype_differs", TypeError, ("o",), _replace(o=lambda o: o.to(other_dtype(o)))),
    BadInput(
        "dtype_differs_from_cfg",
        TypeError,
        ("q", "kernel_cfg"),
        lambda call: call.map_tensors(lambda t: t.to(other_dtype(t))),
    ),
    BadInput("q_rank_3", ValueError, ("q",), _replace(q=lambda q: q.flatten(2))),
    BadInput("o_rank_5", ValueError, ("o",), _replace(o=lambda o: o.unsqueeze(0))),
    BadInput("k_heads_differ", ValueError, ("k",), _replace(k=lambda k: k[:, :, 1:])),
    BadInput("v_batch_differs", ValueError, ("v",), _replace(v=lambda v: v[1:])),
    BadInput("o_seq_len_differs", ValueError, ("o",), _replace(o=lambda o: o[:, : o.shape[1] // 2])),
    BadInput(
        "d_head_differs_from_cfg",
        ValueError,
        ("q", "kernel_cfg"),
        lambda call: call.map_tensors(with_other_d_head),
    ),
    BadInput(
        "q_last_dim_not_contiguous",
        ValueError,
        ("q",),
        _replace(q=lambda q: view_of_wider(q, 2 * q.shape[3], slice(None, None, 2))),
    ),
    BadInput(
        "k_pointer_not_16_byte_aligned",
        ValueError,
        ("k",),
        _replace(k=lambda k: view_of_wider(k, k.shape[3] + 8, slice(1, k.shape[3] + 1))),
    ),
    BadInput(
        "v_strides_not_multiples_of_8",
        ValueError,
        ("v",),
        _replace(v=lambda v: view_of_wider(v, v.shape[3] + 1, slice(None, v.shape[3]))),
    ),
    BadInput("o_is_q", ValueError, ("o",), lambda call: dataclasses.replace(call, o=call.q)),
]


@gpu
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda bad: bad.id)
def test_rejects_bad_input(bad, valid_call):
    if torch.cuda.device_count() < bad.gpus:
        pytest.skip(f"needs {bad.gpus} GPUs, {torch.cuda.device_count()} visible")
    assert_rejected(bad.change(valid_call).run, bad.error, bad.names)
    assert_still_usable(valid_call)


@gpu
@each_config
def test_rejects_seq_len_not_a_multiple_of_the_blocks(cfg, rng):
    small, large = sorted((cfg.B_r, cfg.B_c))
    bad_seq_lens = [large + 16]  # a multiple of neither (both are multiples of 32)
    if small != large:
        bad_seq_lens.append(3 * small)  # a multiple of the smaller block size only
    for seq_len in bad_seq_lens:
        q, k, v = random_qkv(cfg, 2, 3, seq_len, rng)
        assert_rejected(lambda: flash_attention.forward(cfg, q, k, v), ValueError, ("q", "kernel_cfg"), str(seq_len))
    assert_still_usable(make_call(cfg, rng))


# Changes that make a configuration invalid; the message must give validity_error()'s reason.
INVALID_CONFIG_CHANGES = {
    "warps_rows_not_multiple_of_16": {"B_r": 64, "n_warps": 8},
    "eager_without_async": {"async_copy": False, "eager_load_blocks": True},
    "tile_count_not_a_power_of_two": {"Q_mma_load_K_tiles": 0, "K_mma_load_K_tiles": 3},
    "double_buffer_without_chunks": {
        "mma_double_buffer_loads": True,
        "Q_mma_load_K_tiles": 0,
        "K_mma_load_K_tiles": 0,
        "V_mma_load_K_tiles": 0,
    },
}


@gpu
@pytest.mark.parametrize("changes", INVALID_CONFIG_CHANGES.values(), ids=INVALID_CONFIG_CHANGES.keys())
def test_rejects_invalid_config(changes, valid_call):
    invalid = dataclasses.replace(valid_call.cfg, **changes)
    reason = invalid.validity_error()
    assert reason is not None
    assert_rejected(dataclasses.replace(valid_call, cfg=invalid).run, ValueError, ("kernel_cfg",), reason)
    assert_still_usable(valid_call)


@gpu
@pytest.mark.parametrize("entry_point", ["flash_attention.forward", "_C.forward"])
def test_rejects_config_not_compiled(entry_point, valid_call, rng):
    compiled = set(flash_attention.compiled_configs())
    missing = next((cfg for cfg in get_all_kernel_configs() if cfg not in compiled), None)
    if missing is None:
        pytest.skip("every valid configuration is compiled into this build")
    call = make_call(missing, rng)  # tensors that suit it: only its being compiled is missing
    forward = flash_attention.forward if entry_point == "flash_attention.forward" else _C.forward
    run = functools.partial(forward, missing, call.q, call.k, call.v)
    assert_rejected(run, ValueError, ("kernel_cfg",), "FLASH_BUILD_KERNELS")
    assert_still_usable(valid_call)


# The binding accepts any object with a family name and that family's fields (the dataclass normally).
CONFIG_FIELDS = [field.name for field in dataclasses.fields(FlashForwardKernelConfig)]


def plain_config(cfg: FlashForwardKernelConfig) -> types.SimpleNamespace:
    fields = {name: getattr(cfg, name) for name in CONFIG_FIELDS}
    fields["dtype"] = int(cfg.dtype)  # a plain int: what C++ receives either way
    return types.SimpleNamespace(family=cfg.family, **fields)


@gpu
def test_binding_accepts_a_plain_config_object(valid_call):
    call = valid_call
    out, runtime_ms = _C.forward(plain_config(call.cfg), call.q, call.k, call.v)
    assert runtime_ms is None
    assert torch.equal(out, flash_attention.forward(call.cfg, call.q, call.k, call.v))
    _, runtime_ms = _C.forward(plain_config(call.cfg), call.q, call.k, call.v, benchmark=True)
    assert isinstance(runtime_ms, float) and runtime_ms > 0


@gpu
@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_binding_rejects_a_config_missing_a_field(field, valid_call):
    cfg = plain_config(valid_call.cfg)
    delattr(cfg, field)
    call = valid_call
    assert_rejected(lambda: _C.forward(cfg, call.q, call.k, call.v), (TypeError, ValueError), ("kernel_cfg",), field)
    assert_still_usable(valid_call)


@gpu
@pytest.mark.parametrize(("family", "error"), [(None, TypeError), ("sm70", ValueError)], ids=["missing", "unknown"])
def test_binding_rejects_a_config_without_a_known_family(family, error, valid_call):
    cfg = plain_config(valid_call.cfg)
    if family is None:
        delattr(cfg, "family")
    else:
        cfg.family = family
    call = valid_call
    assert_rejected(lambda: _C.forward(cfg, call.q, call.k, call.v), error, ("kernel_cfg",), "family")
    assert_still_usable(valid_call)


@gpu
@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_binding_rejects_a_config_field_of_the_wrong_type(field, valid_call):
    cfg = plain_config(valid_call.cfg)
    setattr(cfg, field, str(getattr(cfg, field)))
    call = valid_call
    assert_rejected(lambda: _C.forward(cfg, call.q, call.k, call.v), TypeError, (f"kernel_cfg.{field}",))
    assert_still_usable(valid_call)


@gpu
def test_rejects_gpus_older_than_sm80(valid_call):
    major, minor = torch.cuda.get_device_capability()
    if major >= 8:
        pytest.skip(f"this GPU is sm_{major}{minor}: rejecting GPUs older than sm_80 needs one to test on")
    assert_rejected(valid_call.run, ValueError, ("q",), "sm_80")
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------
# Tests that need the built module but no GPU


def test_compiled_configs_are_the_build_set_in_python_order():
    assert {family for family, _ in _C.compiled_configs()} <= {"sm80"}
    from_cpp = [FlashForwardKernelConfig(*fields) for _, fields in _C.compiled_configs()]
    # The C++ map iterates in operator< order: it must be the dataclass order, without repeats.
    assert from_cpp == sorted(set(from_cpp))
    assert from_cpp == sorted(get_kernels_to_build(flash_attention.compiled_kernel_set()))
    assert flash_attention.compiled_configs() == from_cpp


@pytest.mark.parametrize("hide_gpus", [False, True], ids=["gpus_visible", "gpus_hidden"])
def test_import_touches_no_gpu(hide_gpus):
    code = (
        "import flash_attention, torch\n"
        "flash_attention.compiled_configs(), flash_attention.compiled_kernel_set()\n"
        "assert not torch.cuda.is_initialized(), 'importing flash_attention initialised CUDA'\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_cpu_tensors_are_rejected(seed):
    cfg = flash_attention.compiled_configs()[0]
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn((1, smallest_seq_len(cfg), 1, cfg.d_head), generator=generator).to(cfg.dtype.to_torch_dtype())
        for _ in range(3)
    )
    assert_rejected(lambda: flash_attention.forward(cfg, q, k, v), ValueError, ("q",))
