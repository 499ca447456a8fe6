"""Exact FLOP counting of a live model with torch's FlopCounterMode (:func:`count_flops`, re-exported by
:mod:`labkit.flops`), and where that count differs from the formulas.

Taught in chapter 3 (FLOPs).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["FlopCount", "count_flops"]


# ------------------------------------------------------------------------------------------------
# Exact counting of a live model
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlopCount:
    """Result of :func:`count_flops`: totals and a per-operator breakdown (forward + backward).

    Taught in chapter 3 (FLOPs).
    """

    total: int
    forward: int
    backward: int
    by_op: dict[str, int]


def _register_cpu_sdpa() -> None:
    """Teach FlopCounterMode the CPU flash-attention kernels (it ships formulas for CUDA ones only).

    Reuses torch's own ``sdpa_flop_count`` / ``sdpa_backward_flop_count`` (full T×T, not causal-halved,
    like torch's CUDA formulas). Idempotent.
    """
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None and fwd not in fc.flop_registry and fwd.default not in fc.flop_registry:
        @fc.register_flop_formula(fwd)
        def _cpu_sdpa(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query_shape, key_shape, value_shape)
    if bwd is not None and bwd not in fc.flop_registry and bwd.default not in fc.flop_registry:
        @fc.register_flop_formula(bwd)
        def _cpu_sdpa_bwd(grad_out_shape, query_shape, key_shape, value_shape, *args,
                          out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _loss_of(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out.float().sum() if out.dim() else out
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, (tuple, list)):
        for o in reversed(out):
            if isinstance(o, torch.Tensor) and o.dim() == 0 and o.requires_grad:
                return o
        return _loss_of(out[0])
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits.float().sum()
    raise TypeError(f"count_flops cannot find a loss or tensor in the model output ({type(out).__name__})")


def count_flops(model, inputs, *, backward: bool = True) -> FlopCount:
    """Exact FLOPs of one forward (and backward) pass of a live model, with torch's FlopCounterMode.

    How this differs from the formulas: FlopCounterMode counts matmuls (mm/addmm/bmm/baddbmm),
    convolutions and SDPA kernels, each as 2 FLOPs per multiply-add, from the real shapes
    (https://pytorch.org/docs/stable/_modules/torch/utils/flop_counter.html). It counts **no**
    elementwise work (GELU, softmax of eager attention, norms, the loss, the optimizer), embedding
    lookups cost 0, and SDPA is counted with the full T×T matrices even when ``is_causal=True``.
    Padded tokens are counted (they are executed). The CPU SDPA kernel
    ``_scaled_dot_product_flash_attention_for_cpu`` has no formula in torch; labkit registers one
    (torch's own SDPA helpers) before counting. torch counts an SDPA *backward* as 2.5× its forward
    (flash-attention backward recomputes QKᵀ), so SDPA models count slightly above 3 × forward; with
    eager attention (explicit bmm's) and ``causal=False`` the "megatron" formula matches this count to
    within the terms it ignores.

    ``inputs``: a tensor, a tuple (positional args) or a dict (keyword args). With ``backward=True``
    the loss (``out.loss``, a scalar in a tuple, or ``sum()`` of the output) is back-propagated.

    Taught in chapter 3 (FLOPs).
    """
    backward = checks.flag("backward", backward)
    if not callable(model):
        raise checks.ArgumentTypeError(f"model must be a callable module, got {type(model).__name__}")
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_sdpa()

    def call():
        if isinstance(inputs, dict):
            return model(**inputs)
        if isinstance(inputs, (tuple, list)):
            return model(*inputs)
        return model(inputs)

    by_op: dict[str, int] = {}

    def merge(counter):
        for op, n in counter.get_flop_counts().get("Global", {}).items():
            by_op[str(op)] = by_op.get(str(op), 0) + int(n)
        return int(counter.get_total_flops())

    with FlopCounterMode(display=False) as fwd_counter:
        out = call()
    forward = merge(fwd_counter)
    back = 0
    if backward:
        loss = _loss_of(out)
        with FlopCounterMode(display=False) as bwd_counter:
            loss.backward()
        back = merge(bwd_counter)
    return FlopCount(total=forward + back, forward=forward, backward=back, by_op=by_op)
