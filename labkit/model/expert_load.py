"""Load statistics of a mixture-of-experts layer, torch-free: what a run record's routing counts mean.

- :func:`load_imbalance`: max / mean of the tokens each expert received — 1.0 when the router spread the
  token copies evenly, E when one expert took them all. Under expert parallelism the busiest expert sets the
  step time of its rank (every other rank waits for it at the combine all-to-all), so this ratio is the
  slowdown of the expert computation over a balanced router.
- :func:`balance_loss`: the auxiliary load-balancing loss of Switch Transformers (Fedus, Zoph & Shazeer
  2022, JMLR 23, §2.2, eq. 4–6; GShard, Lepikhin et al. 2021, §2.2 Algorithm 1, has the same form up to
  a factor 1/E², counting first choices only):
  ``E · Σ_i f_i · P_i`` with ``f_i`` the fraction of token copies dispatched to expert i and ``P_i`` the mean
  router probability of expert i. Both are distributions over the E experts, so the loss is 1.0 under a
  uniform router and at most E (everything on one expert). With top-k routing ``f_i`` counts all k copies of
  each token (counts / (tokens · k)). :class:`labkit.model.moe.MoE` computes the same sum on tensors (the ``P_i``
  term differentiable), this function recomputes it from recorded numbers.

Taught in chapter 26 (long sequences and MoE).
"""
from __future__ import annotations

import math

from labkit import checks

__all__ = ["balance_loss", "load_imbalance"]


def _vector(name: str, values, *, sums_to_one: bool = False) -> list[float]:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise checks.ArgumentTypeError(f"{name} must be a sequence of numbers (one per expert), "
                                       f"got {type(values).__name__} {values!r}")
    out = [checks.nonneg(f"{name}[{i}]", v) for i, v in enumerate(values)]
    if len(out) < 2:
        raise ValueError(f"{name} must hold one value per expert for at least 2 experts, got {len(out)}")
    if sums_to_one and not math.isclose(sum(out), 1.0, rel_tol=1e-6, abs_tol=1e-6):
        raise ValueError(f"{name} must be a distribution over the experts (sum 1), sums to {sum(out)!r}")
    return out


def load_imbalance(counts) -> float:
    """max / mean of ``counts`` (tokens routed to each expert in one step, one MoE layer): 1.0 is perfectly
    balanced, ``len(counts)`` is every token on one expert. Taught in chapter 26."""
    c = _vector("counts", counts)
    top = max(c)
    if top <= 0:
        raise ValueError(f"counts={list(counts)!r} has no tokens: load imbalance needs at least one routed token")
    # max / mean = n / Σ(cᵢ / max): each term ≤ 1, so no sum overflows (Σ of [1e308, 1e308] is inf: it gave 0.0)
    return len(c) / math.fsum(v / top for v in c)


def balance_loss(fractions, probs) -> float:
    """Switch Transformers' auxiliary loss ``E · Σ_i f_i · P_i`` (see the module docstring) from the fraction
    of token copies each expert received (``fractions``, sum 1) and the mean router probability of each
    expert (``probs``, sum 1). Taught in chapter 26."""
    f = _vector("fractions", fractions, sums_to_one=True)
    p = _vector("probs", probs, sums_to_one=True)
    if len(f) != len(p):
        raise ValueError(f"fractions has {len(f)} experts but probs has {len(p)}: give one value per expert in each")
    return len(f) * sum(a * b for a, b in zip(f, p, strict=True))
