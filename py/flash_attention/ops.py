"""The attention forward as PyTorch operators, so torch.compile traces it without a graph break:

    torch.ops.flash_attention.forward(q, k, v, config, causal, softmax_scale, window_size, softcap,
                                      alibi_slopes, return_lse) -> (o, lse)
    torch.ops.flash_attention.forward_out(...same..., o) -> lse        (writes o in place)

``config`` is a configuration's short form, or "" to let the automatic choice (``choose_config``'s)
pick one when the call runs. ``window_size`` is the pair (left, right). Without ``return_lse``,
``lse`` is an empty float32 tensor (an operator's outputs cannot be optional). The fake implementations give the outputs' shapes and dtypes for tracing.

There is no backward pass yet. Calling forward with an input that requires grad while grad mode is
on raises, rather than return an output detached from the graph; callers of forward_out check
first (check_no_grad).
"""

import torch
from torch import Tensor

from . import _C
from .dispatch import load_dispatch_tables
from .kernels import cached_config

__all__ = ["MISSING_BACKWARD", "check_no_grad", "forward", "forward_out", "launch", "run"]

MISSING_BACKWARD = (
    "flash_attention has no backward pass yet, and q, k or v requires grad with grad mode on: "
    "run the forward under torch.no_grad() or torch.inference_mode(), or pass detached tensors"
)


def launch(cfg, q, k, v, o, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, heads_first=False):
    """The extension's forward with a checked configuration (kernels.cached_config's), or None for
    the automatic choice: (o, lse or None). The extension checks every other argument. It checks no
    grad: callers outside the operators do (check_no_grad)."""
    if cfg is None:
        load_dispatch_tables()
    out, lse, _ = _C.forward(
        cfg, q, k, v, o, False, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, heads_first
    )
    return out, lse


def run(q, k, v, o, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse):
    """What both operators run: launch with the configuration of a short form, or "" for the
    automatic choice; lse is an empty tensor without return_lse."""
    cfg = cached_config(config) if config else None
    out, lse = launch(cfg, q, k, v, o, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse)
    return out, (lse if return_lse else _no_lse(q))


def _no_lse(q: Tensor) -> Tensor:
    return q.new_empty(0, dtype=torch.float32)


def _fake_lse(q: Tensor, return_lse: bool) -> Tensor:
    batch, seqlen_q, heads_q, _ = q.shape
    return q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32) if return_lse else _no_lse(q)


@torch.library.custom_op("flash_attention::forward", mutates_args=())
def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    config: str,
    causal: bool,
    softmax_scale: float | None,
    window_size: list[int],
    softcap: float,
    alibi_slopes: Tensor | None,
    return_lse: bool,
) -> tuple[Tensor, Tensor]:
    """Attention with FlashAttention-2's semantics (see flash_attention.forward); returns (o, lse)."""
    return run(q, k, v, None, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse)


@forward.register_fake
def _forward_fake(q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse):
    return q.new_empty(q.shape), _fake_lse(q, return_lse)


@torch.library.custom_op("flash_attention::forward_out", mutates_args=("o",))
def forward_out(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    config: str,
    causal: bool,
    softmax_scale: float | None,
    window_size: list[int],
    softcap: float,
    alibi_slopes: Tensor | None,
    return_lse: bool,
    o: Tensor,
) -> Tensor:
    """As forward, writing the output into o; returns lse."""
    return run(q, k, v, o, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse)[1]


@forward_out.register_fake
def _forward_out_fake(q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, o):
    return _fake_lse(q, return_lse)


def _missing_backward(*_, **__):
    # Autograd calls setup_context during the forward, and only when an input requires grad with
    # grad mode on: raising there stops the call before it returns a detached output. The same
    # function stands in as the backward, which therefore never runs.
    raise NotImplementedError(MISSING_BACKWARD)


torch.library.register_autograd(forward, _missing_backward, setup_context=_missing_backward)


def check_no_grad(*tensors) -> None:
    """Raises where autograd would need our missing backward. forward_out needs it from its callers:
    PyTorch registers no autograd formula for an operator that writes an argument in place."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise NotImplementedError(MISSING_BACKWARD)
