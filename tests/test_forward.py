"""Tests of the forward pass: results against a float32 reference, how q, k, v and o are read and
written, stream and device handling, and the checks that reject bad arguments.

GPU tests (marked ``gpu``) run once per compiled configuration, or per compiled configuration that
the KERNELS environment variable selects. The tests at the end need no GPU, only the built module.
The masks, lengths, grouped heads and score modifications are swept in test_features.py.
"""

import dataclasses
import functools
import math
import os
import subprocess
import sys
import types
from collections.abc import Callable
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")

import helpers  # noqa: E402

if not helpers.extension_is_built():
    pytest.skip(helpers.NOT_BUILT_REASON, allow_module_level=True)

import flash_attention  # noqa: E402
from flash_attention import _C  # noqa: E402
from flash_helpers.families import FAMILIES  # noqa: E402
from flash_helpers.kernel_sets import get_kernels_to_build, variants_to_build  # noqa: E402
from flash_helpers.problem import ALL_VARIANTS, MaskKind, ProblemVariant  # noqa: E402
from flash_helpers.tuning_space import get_all_kernel_configs  # noqa: E402
from helpers import Problem, as_layout, assert_matches_reference, nan_like, random_qkv  # noqa: E402

gpu = pytest.mark.gpu

# GPU clock cycles the stream test keeps its stream busy for (about 10 ms): far longer than the
# time it takes to queue the kernel behind it.
STREAM_BUSY_CYCLES = 20_000_000

CONFIGS = helpers.configs_under_test()
each_config = pytest.mark.parametrize("cfg", CONFIGS, ids=lambda cfg: cfg.short_form())


def smallest_seq_len(cfg) -> int:
    return helpers.whole_blocks(cfg)


def reference_shapes(cfg) -> list[tuple[int, int, int]]:
    """(batch, heads, seq_len) to check results at: batch and heads not powers of two, seq_len from
    one block up to 16384, including an odd number of blocks and a grid larger than the GPU."""
    block = smallest_seq_len(cfg)
    # 2048 and 16384 rounded up to whole blocks: the tuning sets compile no masked tails.
    return [(1, 1, block), (3, 5, block), (3, 5, 3 * block), (5, 3, whole(2048, block)), (1, 2, whole(16384, block))]


def whole(seq_len: int, block: int) -> int:
    return -(-seq_len // block) * block


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


def deferred_rescale_twins() -> list:
    """The deferred_O_rescale configurations under test whose twin (the same block rescaling O right
    after P V) is under test too."""
    return [
        cfg for cfg in CONFIGS
        if getattr(cfg, "deferred_O_rescale", False) and dataclasses.replace(cfg, deferred_O_rescale=False) in CONFIGS
    ]  # fmt: skip


@gpu
@helpers.gpu_cases(
    "cfg",
    [(cfg,) for cfg in deferred_rescale_twins()],
    lambda cfg: cfg.short_form(),
    "no deferred_O_rescale (odefer) block is compiled beside its twin: the default set has none; build a "
    "selection with both (FLASH_BUILD_KERNELS)",
)
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
def test_deferred_O_rescale_matches_its_twin_bit_for_bit(cfg, causal, rng):
    """O rescaled in the next turn, before the P V that adds to it, is the same multiplication of the
    same values as right after the P V in flight: the same bits, on keys whose scale grows along the
    sequence so that rows rescale on many tiles."""
    twin = dataclasses.replace(cfg, deferred_O_rescale=False)
    q, k, v = random_qkv(cfg, 2, 3, 16 * smallest_seq_len(cfg), rng)
    k = ramped_keys(k, 0.25, 8.0)
    deferred = flash_attention.forward(cfg, q, k, v, nan_like(q), causal=causal)
    assert torch.equal(deferred, flash_attention.forward(twin, q, k, v, nan_like(q), causal=causal))
    assert_matches_reference(deferred, q, k, v, causal=causal)


@gpu
@each_config
def test_repeated_calls_are_bitwise_identical(cfg, rng):
    q, k, v = random_qkv(cfg, 3, 5, 3 * smallest_seq_len(cfg), rng)
    first = flash_attention.forward(cfg, q, k, v, nan_like(q))
    second = flash_attention.forward(cfg, q, k, v, nan_like(q))
    assert torch.equal(first, second)


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
        "producer_registers",
        "consumer_registers",
    }
    # The traits' layout and the validity rule's count agree.
    assert attributes["dynamic_smem_bytes"] == cfg.smem_bytes()
    assert 0 < attributes["registers"] <= 255
    assert attributes["max_threads_per_block"] >= cfg.n_threads, "the kernel cannot launch with its threads"


@gpu
@pytest.mark.parametrize(
    "cfg", helpers.configs_under_test(decoding=True, fp8=True), ids=lambda cfg: cfg.short_form()
)
def test_kernel_attributes_of_each_variant(cfg):
    """Every compiled variant's kernel reports its own attributes (an FP8 cache's tiles take less
    shared memory than the 16-bit ones); without a variant, the first compiled one's."""
    variants = flash_attention.compiled_variants(cfg)
    assert flash_attention.kernel_attributes(cfg) == flash_attention.kernel_attributes(cfg, variants[0])
    for variant in variants:
        attributes = flash_attention.kernel_attributes(cfg, variant)
        assert 0 < attributes["registers"] <= 255, variant.describe()
        assert attributes["max_threads_per_block"] >= cfg.n_threads, variant.describe()
        # The validity rule, which decides whether a configuration fits a GPU, counts the most.
        assert 0 < attributes["dynamic_smem_bytes"] <= cfg.smem_bytes(), variant.describe()
        assert (attributes["producer_registers"], attributes["consumer_registers"]) == registers_moved(cfg, variant), (
            variant.describe()
        )


def registers_moved(cfg, variant) -> tuple[int, int]:
    """The (producer, consumer) registers per thread a kernel's setmaxnreg sets, as the Python
    configuration counts them ((0, 0) where it moves none). With e4m3 this is where the choice of
    V's transposer (by rows or by matrices, which the C++ traits make too) shows."""
    if cfg.family != "sm90" or not cfg.moves_registers:
        return 0, 0
    return cfg.producer_registers(variant.varlen), cfg.consumer_registers(variant.varlen)


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
    kwargs: dict = dataclasses.field(default_factory=dict)  # causal, window_size, softcap, ...

    def run(self):
        return flash_attention.forward(self.cfg, self.q, self.k, self.v, self.o, **self.kwargs)

    def map_tensors(self, change: Callable) -> "Call":
        return dataclasses.replace(self, q=change(self.q), k=change(self.k), v=change(self.v), o=change(self.o))


# The valid call: grouped heads (6 query heads, 3 key/value heads) and more keys than queries, in
# whole blocks and unmasked, which every compiled configuration serves.
VALID_HEADS_Q, VALID_HEADS_KV = 6, 3


def make_call(cfg, rng) -> Call:
    block = smallest_seq_len(cfg)
    inputs = Problem(2 * block, 3 * block, VALID_HEADS_Q, VALID_HEADS_KV, batch=2).make(cfg, rng)
    return Call(cfg, inputs.q, inputs.k, inputs.v, nan_like(inputs.q))


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
    assert_matches_reference(out, call.q, call.k, call.v, **call.kwargs)


def other_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.bfloat16 if t.dtype == torch.float16 else torch.float16


def with_other_d_head(t: torch.Tensor) -> torch.Tensor:
    """A wider head: more than any configuration of t's head size holds."""
    return t.new_empty((*t.shape[:3], t.shape[3] + 8))


def with_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.new_empty((*t.shape[:2], heads, t.shape[3]))


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


def _keywords(**values) -> Callable[[Call], Call]:
    """A change that passes keyword arguments: values, or functions of the valid call giving them."""

    def change(call: Call) -> Call:
        given = {name: value(call) if callable(value) else value for name, value in values.items()}
        return dataclasses.replace(call, kwargs={**call.kwargs, **given})

    return change


def _slopes(shape: Callable[[Call], tuple], dtype=torch.float32, device: str | None = None) -> Callable[[Call], object]:
    """ALiBi slopes of a shape (a function of the valid call), dtype and device (q's by default)."""
    return lambda call: torch.full(shape(call), 0.1, dtype=dtype, device=device or call.q.device)


def _both_kv(change: Callable) -> Callable[[Call], Call]:
    return _replace(k=change, v=change)


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
    # k and v: (batch, seqlen_k, heads_kv, d_head), q's batch and d_head, heads_kv dividing heads_q; v of k's shape.
    BadInput("heads_q_not_a_multiple_of_heads_kv", ValueError, ("k",), _both_kv(lambda t: with_heads(t, 4))),
    BadInput("more_kv_heads_than_q_heads", ValueError, ("k",), _both_kv(lambda t: with_heads(t, 12))),
    BadInput("k_batch_differs", ValueError, ("k",), _both_kv(lambda t: t[1:])),
    BadInput("k_d_head_differs", ValueError, ("k",), _both_kv(with_other_d_head)),
    BadInput("v_heads_differ_from_k", ValueError, ("v",), _replace(v=lambda v: v[:, :, 1:])),
    BadInput("v_seq_len_differs_from_k", ValueError, ("v",), _replace(v=lambda v: v[:, 1:])),
    BadInput("v_batch_differs", ValueError, ("v",), _replace(v=lambda v: v[1:])),
    # o: q's shape.
    BadInput("o_seq_len_differs", ValueError, ("o",), _replace(o=lambda o: o[:, : o.shape[1] // 2])),
    BadInput("o_has_the_shape_of_k", ValueError, ("o",), lambda call: dataclasses.replace(call, o=nan_like(call.k))),
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
    # window_size: a pair of ints, each -1 (unbounded) or >= 0.
    BadInput("window_left_below_minus_1", ValueError, ("window_size",), _keywords(window_size=(-2, 0))),
    BadInput("window_right_below_minus_1", ValueError, ("window_size",), _keywords(window_size=(0, -5))),
    # causal sets the right side to 0, but a bad value given for it is still an error.
    BadInput(
        "window_right_below_minus_1_with_causal",
        ValueError,
        ("window_size",),
        _keywords(causal=True, window_size=(0, -5)),
    ),
    BadInput("window_left_a_float", TypeError, ("window_size",), _keywords(window_size=(1.5, 0))),
    BadInput("window_right_a_string", TypeError, ("window_size",), _keywords(window_size=(0, "3"))),
    BadInput("window_size_not_a_pair", TypeError, ("window_size",), _keywords(window_size=5)),
    BadInput("window_size_of_three", TypeError, ("window_size",), _keywords(window_size=(1, 2, 3))),
    # softcap: finite and >= 0.
    BadInput("softcap_negative", ValueError, ("softcap",), _keywords(softcap=-1.0)),
    BadInput("softcap_nan", ValueError, ("softcap",), _keywords(softcap=math.nan)),
    BadInput("softcap_inf", ValueError, ("softcap",), _keywords(softcap=math.inf)),
    BadInput("softcap_a_string", TypeError, ("softcap",), _keywords(softcap="30")),
    # softmax_scale: finite and > 0.
    BadInput("softmax_scale_zero", ValueError, ("softmax_scale",), _keywords(softmax_scale=0.0)),
    BadInput("softmax_scale_negative", ValueError, ("softmax_scale",), _keywords(softmax_scale=-0.125)),
    BadInput("softmax_scale_nan", ValueError, ("softmax_scale",), _keywords(softmax_scale=math.nan)),
    BadInput("softmax_scale_inf", ValueError, ("softmax_scale",), _keywords(softmax_scale=math.inf)),
    BadInput("softmax_scale_a_string", TypeError, ("softmax_scale",), _keywords(softmax_scale="0.1")),
    # alibi_slopes: a float32 tensor on q's device, (heads_q,) or (batch, heads_q).
    BadInput(
        "alibi_slopes_per_kv_head",
        ValueError,
        ("alibi_slopes",),
        _keywords(alibi_slopes=_slopes(lambda call: (call.k.shape[2],))),
    ),
    BadInput(
        "alibi_slopes_batch_differs",
        ValueError,
        ("alibi_slopes",),
        _keywords(alibi_slopes=_slopes(lambda call: (call.q.shape[0] + 1, call.q.shape[2]))),
    ),
    BadInput(
        "alibi_slopes_rank_3",
        ValueError,
        ("alibi_slopes",),
        _keywords(alibi_slopes=_slopes(lambda call: (1, call.q.shape[0], call.q.shape[2]))),
    ),
    BadInput(
        "alibi_slopes_float16",
        TypeError,
        ("alibi_slopes",),
        _keywords(alibi_slopes=_slopes(lambda call: (call.q.shape[2],), dtype=torch.float16)),
    ),
    BadInput(
        "alibi_slopes_on_cpu",
        ValueError,
        ("alibi_slopes",),
        _keywords(alibi_slopes=_slopes(lambda call: (call.q.shape[2],), device="cpu")),
    ),
    BadInput(
        "alibi_slopes_on_another_gpu",
        ValueError,
        ("alibi_slopes",),
        _keywords(alibi_slopes=_slopes(lambda call: (call.q.shape[2],), device="cuda:1")),
        gpus=2,
    ),
    BadInput(
        "alibi_slopes_a_list",
        TypeError,
        ("alibi_slopes",),
        _keywords(alibi_slopes=lambda call: [0.1] * call.q.shape[2]),
    ),
]


@gpu
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda bad: bad.id)
def test_rejects_bad_input(bad, valid_call):
    if torch.cuda.device_count() < bad.gpus:
        pytest.skip(f"needs {bad.gpus} GPUs, {torch.cuda.device_count()} visible")
    assert_rejected(bad.change(valid_call).run, bad.error, bad.names)
    assert_still_usable(valid_call)


NO_KERNEL = "has no kernel for this problem"


@gpu
@each_config
def test_lengths_that_are_not_multiples_of_the_blocks(cfg, rng):
    """Served by the masked-tails variant where it is compiled; rejected, naming the configuration,
    where it is not."""
    small, large = sorted((cfg.B_r, cfg.B_c))
    # (seqlen_q, seqlen_k): a multiple of neither block (both are multiples of 32), q's or k's alone.
    lengths = [(large + 16, large + 16), (2 * large, large + 16), (large + 16, 2 * large)]
    if small != large:
        only_small = small * (large // math.gcd(small, large) + 1)  # a multiple of the smaller block size only
        lengths.append((only_small, only_small))
    served = ProblemVariant(MaskKind.NONE, masked_tails=True) in flash_attention.compiled_variants(cfg)
    for seqlen_q, seqlen_k in lengths:
        inputs = Problem(seqlen_q, seqlen_k, VALID_HEADS_Q, VALID_HEADS_KV).make(cfg, rng)
        if served:
            out = inputs.forward(cfg, nan_like(inputs.q))
            assert not out.isnan().any(), "some output elements were not written"
            assert_matches_reference(out, inputs.q, inputs.k, inputs.v)
        else:
            assert_rejected(lambda: inputs.forward(cfg), ValueError, ("kernel_cfg",), NO_KERNEL)
    assert_still_usable(make_call(cfg, rng))


def short_last_query_block_cases() -> list:
    """(configuration, causal) pairs under test compiled with that mask's masked-tails variant."""
    cases = [
        pytest.param(cfg, causal, id=f"{cfg.short_form()}-{'causal' if causal else 'no_mask'}")
        for cfg in CONFIGS
        for causal in (False, True)
        if ProblemVariant(MaskKind.CAUSAL if causal else MaskKind.NONE, masked_tails=True)
        in flash_attention.compiled_variants(cfg)
    ]
    reason = "no configuration under test is compiled with the masked-tails variants (a default build has them)"
    return cases or [pytest.param(None, None, marks=pytest.mark.skip(reason=reason))]


@gpu
@pytest.mark.parametrize("cfg, causal", short_last_query_block_cases())
def test_short_last_query_blocks_in_a_grid_larger_than_the_gpu(cfg, causal, rng):
    """The last query block holds 16 rows, so (with B_r > 64) the Hopper family's later warpgroups
    have no rows there; more work tiles than the GPU has multiprocessors, so persistent blocks
    take several, short ones among them."""
    seqlen = 2 * cfg.B_r + 16
    heads = -(-2 * torch.cuda.get_device_properties(0).multi_processor_count // 3)  # 3 query blocks per head
    helpers.check_forward(cfg, Problem(seqlen, seqlen, heads, heads, batch=1, causal=causal).make(cfg, rng))


def kernels_not_compiled() -> list:
    """(configuration, variant) pairs under test without a compiled kernel (tuning builds have them)."""
    missing = [
        pytest.param(cfg, variant, id=f"{cfg.short_form()}-{helpers.variant_id(variant)}")
        for cfg in CONFIGS
        for variant in ALL_VARIANTS
        if variant not in flash_attention.compiled_variants(cfg)
    ]
    reason = "every configuration under test has every problem variant (a FLASH_BUILD_KERNELS=tune build has not)"
    return missing or [pytest.param(None, None, marks=pytest.mark.skip(reason=reason))]


@gpu
@pytest.mark.parametrize("cfg, variant", kernels_not_compiled())
def test_rejects_a_problem_without_a_compiled_kernel(cfg, variant, rng):
    inputs = helpers.problem_for_variant(cfg, variant).make(cfg, rng)
    assert_rejected(lambda: inputs.forward(cfg), ValueError, ("kernel_cfg",), NO_KERNEL)
    assert_still_usable(make_call(cfg, rng))


# Changes that make a configuration of a family invalid; the message must give validity_error()'s
# reason.
INVALID_CONFIG_CHANGES = {
    ("sm80", "key_groups_of_fewer_than_16_keys"): {"B_r": 16, "B_c": 32},
    ("sm80", "eager_without_async"): {"async_copy": False, "eager_load_blocks": True},
    ("sm80", "tile_count_not_a_power_of_two"): {"Q_mma_load_K_tiles": 0, "K_mma_load_K_tiles": 3},
    ("sm80", "double_buffer_without_chunks"): {
        "mma_double_buffer_loads": True,
        "Q_mma_load_K_tiles": 0,
        "K_mma_load_K_tiles": 0,
        "V_mma_load_K_tiles": 0,
    },
    ("sm90", "pingpong_without_warp_specialization"): {"warp_specialized": False, "pingpong": True},
    ("sm90", "B_c_not_a_multiple_of_16"): {"B_c": 72},
}


@gpu
@pytest.mark.parametrize(
    "family, changes", [(family, changes) for (family, _), changes in INVALID_CONFIG_CHANGES.items()],
    ids=[f"{family}-{name}" for family, name in INVALID_CONFIG_CHANGES],
)
def test_rejects_invalid_config(family, changes, rng):
    cfg = next((cfg for cfg in CONFIGS if cfg.family == family), None)
    if cfg is None:
        pytest.skip(f"no {family} configuration under test")
    valid_call = make_call(cfg, rng)
    invalid = dataclasses.replace(cfg, **changes)
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
# The fields of valid_call's configuration (the first under test), each of which the binding needs.
CONFIG_FIELDS = [field.name for field in dataclasses.fields(CONFIGS[0])] if CONFIGS else []


def plain_config(cfg) -> types.SimpleNamespace:
    fields = {field.name: getattr(cfg, field.name) for field in dataclasses.fields(cfg)}
    fields["dtype"] = int(cfg.dtype)  # a plain int: what C++ receives either way
    return types.SimpleNamespace(family=cfg.family, **fields)


@gpu
def test_binding_accepts_a_plain_config_object(valid_call):
    call = valid_call
    out, lse, runtime_ms = _C.forward(plain_config(call.cfg), call.q, call.k, call.v)
    assert lse is None and runtime_ms is None
    assert torch.equal(out, flash_attention.forward(call.cfg, call.q, call.k, call.v))
    _, lse, runtime_ms = _C.forward(plain_config(call.cfg), call.q, call.k, call.v, benchmark=True, return_lse=True)
    assert isinstance(runtime_ms, float) and runtime_ms > 0
    assert lse.shape == (call.q.shape[0], call.q.shape[2], call.q.shape[1]) and lse.dtype == torch.float32


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
def test_rejects_a_hopper_config_on_another_gpu(rng):
    capability = torch.cuda.get_device_capability()
    sm90_configs = [cfg for cfg in flash_attention.compiled_configs() if cfg.family == "sm90"]
    if capability == (9, 0) or not sm90_configs:
        pytest.skip(f"this GPU is sm_{capability[0]}{capability[1]} and the build has {len(sm90_configs)} Hopper "
                    "configurations: rejecting them needs a build with some and a GPU other than sm_90")
    call = make_call(sm90_configs[0], rng)
    assert_rejected(call.run, ValueError, ("q",), "sm_90")
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()


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


def test_compiled_kernels_are_the_build_set_in_python_order():
    kernels = _C.compiled_kernels()
    assert {family for family, _, _ in kernels} <= set(FAMILIES)
    from_cpp = [
        (FAMILIES[family](*fields), ProblemVariant(MaskKind(mask), *flags))
        for family, fields, (mask, *flags) in kernels
    ]
    # The C++ map iterates in operator< order (configuration, then variant): it must be the
    # dataclasses' order, without repeats.
    assert from_cpp == sorted(set(from_cpp))
    # The architectures the module was compiled for decide whether the set's Hopper part was built.
    built = get_kernels_to_build(flash_attention.compiled_kernel_set(), helpers.compiled_arch_list())
    assert from_cpp == sorted((cfg, variant) for cfg in built for variant in variants_to_build(cfg))
    assert flash_attention.compiled_kernels() == from_cpp
    assert flash_attention.compiled_configs() == sorted(built)
    for cfg in flash_attention.compiled_configs():
        assert flash_attention.compiled_variants(cfg) == [variant for c, variant in from_cpp if c == cfg]
        assert flash_attention.compiled_variants(cfg.short_form()) == flash_attention.compiled_variants(cfg)


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


@pytest.mark.parametrize("window_size", [5, (1, 2, 3), None], ids=["int", "triple", "none"])
def test_window_size_that_is_not_a_pair_is_rejected(window_size):
    cfg = flash_attention.compiled_configs()[0]
    q = torch.randn((1, smallest_seq_len(cfg), 1, cfg.d_head)).to(cfg.dtype.to_torch_dtype())
    assert_rejected(lambda: flash_attention.forward(cfg, q, q, q, window_size=window_size), TypeError, ("window_size",))
