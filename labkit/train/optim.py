"""The trainer's optimizer: AdamW in the implementation ``TrainConfig.optimizer_impl`` names.

torch ships three implementations of the same update (https://pytorch.org/docs/stable/optim.html,
"Algorithms" and the ``foreach``/``fused`` arguments of ``torch.optim.AdamW``):

- ``"for-loop"`` (``foreach=False``): for each parameter tensor, a handful of elementwise ops (moments,
  bias correction, the update) — ≈ 10 ops × the number of tensors, each a launch (GPU) or a dispatch (CPU);
- ``"foreach"`` (``foreach=True``): the same ops as ``torch._foreach_*`` calls over lists of tensors — on a
  GPU one multi-tensor kernel per op for many tensors at once ("horizontal" fusion); on a CPU a C++ loop
  over the tensors, so the Python and dispatcher cost is paid per op, not per op × tensor;
- ``"fused"`` (``fused=True``): the whole update in one kernel per group of tensors (CUDA, and CPU since
  torch 2.4) — the moments are read and written once;
- ``"auto"``: torch's own default (foreach when every parameter is on CUDA, for-loop otherwise).

The updates agree to float rounding (tests/test_fusion.py); only the number of kernels and the memory
traffic differ. Taught in chapter 17 (fusion).
"""
from __future__ import annotations

IMPL_KWARGS = {"auto": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def build_optimizer(params, cfg):
    """``torch.optim.AdamW(params, lr=cfg.lr)`` in ``cfg.optimizer_impl``'s implementation (see the module
    docstring); ``params``: a model or an iterable of parameters. Taught in chapter 17."""
    import torch

    from labkit.train.config import TrainConfig

    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"build_optimizer needs a TrainConfig, got {type(cfg).__name__}")
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    return torch.optim.AdamW(params, lr=cfg.lr, **IMPL_KWARGS[cfg.optimizer_impl])


def implementation(opt) -> str:
    """Which implementation an AdamW ``opt`` will run: "fused", "foreach" or "for-loop" (torch's "auto"
    resolved as torch resolves it for these parameters). Taught in chapter 17."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    group = opt.param_groups[0]
    if group.get("fused"):
        return "fused"
    if group.get("foreach") is not None:
        return "foreach" if group["foreach"] else "for-loop"
    params = [p for g in opt.param_groups for p in g["params"]]
    _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    return "foreach" if foreach else "for-loop"
