"""Activation-checkpointing policies by name: which blocks keep their activations, which recompute them.

One vocabulary for the trainer (``TrainConfig(checkpoint=…)``), the FLOP model
(:func:`labkit.flops.hardware_flops_per_token`) and the memory model
(:func:`labkit.memory.estimate.activation_bytes`). Torch-free. Taught in chapter 21 (activation checkpointing).
"""
from __future__ import annotations

from labkit import checks

__all__ = ["CHECKPOINT_POLICIES", "checkpoint_policy", "checkpointed_blocks", "recompute_mode", "recompute_share"]

#: the policy names of :func:`checkpoint_policy` ("every:k" with k a whole number ≥ 1)
CHECKPOINT_POLICIES = ("none", "full", "attention", "every:k")


def checkpoint_policy(value, n_layers: int | None = None) -> str:
    """The canonical name of an activation-checkpointing policy, or a ValueError naming what is valid.

    ``False`` / ``"none"``: keep every activation; ``True`` / ``"full"``: checkpoint every transformer block
    (keep its input, recompute its forward in backward — Chen et al. 2016, https://arxiv.org/abs/1604.06174);
    ``"every:k"``: checkpoint blocks 0, k, 2k, … (⌈L/k⌉ of L; ``"every:1"`` is ``"full"``); ``"attention"``:
    recompute only the attention core of every block (QKᵀ, softmax, ·V) and keep the rest — Korthikanti et
    al. 2022's *selective* recomputation (§5, https://arxiv.org/abs/2205.05198). With ``n_layers``, k must be
    at most the number of blocks. Taught in chapter 21 (activation checkpointing).
    """
    if value is False or value is None:
        return "none"
    if value is True:
        return "full"
    valid = ("choose False/'none', True/'full', 'attention' (the attention core only) or 'every:k' "
             "(every k-th block, k a whole number ≥ 1)")
    if not isinstance(value, str):
        raise ValueError(f"checkpoint={value!r} is not valid: {valid}")
    v = value.strip().lower()
    if v in ("none", "full", "attention"):
        return v
    if v.startswith("every:"):
        k = v[len("every:"):].strip()
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"checkpoint={value!r} is not valid: k in 'every:k' must be a whole number ≥ 1; {valid}")
        k = int(k)
        if n_layers is not None and k > n_layers:
            raise ValueError(f"checkpoint={value!r} is not valid for a model of {n_layers} blocks: k must be "
                             f"between 1 and {n_layers}")
        return "full" if k == 1 else f"every:{k}"
    raise ValueError(f"checkpoint={value!r} is not valid: {valid}")


def checkpointed_blocks(policy, n_layers: int) -> tuple[int, ...]:
    """Indices of the blocks a policy checkpoints whole (none for "none" and "attention", whose blocks
    keep their activations but the attention core's). Taught in chapter 21."""
    n_layers = checks.count("n_layers", n_layers)
    p = checkpoint_policy(policy, n_layers)
    if p == "full":
        return tuple(range(n_layers))
    if p.startswith("every:"):
        return tuple(range(0, n_layers, int(p.split(":")[1])))
    return ()


def recompute_mode(policy) -> str:
    """The ``recompute`` argument of :func:`labkit.flops.hardware_flops_per_token` and
    :func:`labkit.memory.estimate.activation_bytes` for a checkpointing policy: "none", "full", "selective"
    (the attention core) or "every:k". Taught in chapter 21."""
    p = checkpoint_policy(policy)
    return "selective" if p == "attention" else p


def recompute_share(recompute, n_layers: int, modes=("none", "selective", "full")) -> tuple[str, float]:
    """(mode, share of the layers recomputed whole) of a ``recompute`` argument: one of ``modes``,
    "attention" (= "selective") or "every:k" (→ "full" on ⌈L/k⌉ of L layers), or a ValueError naming what is
    valid. Taught in chapter 21."""
    if recompute in modes:
        return recompute, 1.0
    try:
        if not isinstance(recompute, str):           # a name, not a TrainConfig-style bool
            raise ValueError(recompute)
        mode = recompute_mode(checkpoint_policy(recompute, n_layers))
    except ValueError:
        raise ValueError(f"recompute={recompute!r} is not valid; choose one of {tuple(modes)}, 'attention' "
                         f"(= 'selective') or 'every:k' (1 ≤ k ≤ the {n_layers} layers)") from None
    if mode.startswith("every:"):
        return "full", len(checkpointed_blocks(mode, n_layers)) / n_layers
    return mode, 1.0
