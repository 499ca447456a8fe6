"""Adaptive gradient accumulation: the source's ``DynamicGradAccum`` rule as a controller the trainer calls
between steps, with the safeguards that keep optimisation honest when the global batch moves.

The rule (the course source, chapter 25): over a window of ``window`` steps, take the mean of
communication ÷ compute; set accumulation to ``round(mean)``, capped at ``cap``; change it only when the
new value differs from the current one by at least ``hysteresis``. Never below 1.

⚠ **What the ratio is measured against.** With accumulation k and ``no_sync`` on all but the last
micro-batch, a step computes k micro-batches and communicates once. Measured per *step*, compute grows
with k, so the ratio falls as k rises: from k = 1 with comm = 4 × compute the rule picks 4, then sees
4 ÷ 4 = 1 and goes back to 1 — it oscillates (:func:`simulate` shows it). Measured per *micro-batch*
(comm ÷ (compute ÷ k)) the ratio does not depend on k, and k = round(ratio) is the accumulation at which
a step's compute covers its communication. ``per="micro_batch"`` (default) is that; ``per="step"`` is the
literal reading, kept to show the oscillation.

Safeguards (:func:`scaled_lr`, :class:`ValidationGuard`): the global batch changes with k, so the learning
rate must follow — ⚠ ``lr × k`` is Goyal et al. 2017's linear rule for SGD, not a default for AdamW; for
Adam-type optimisers the square-root rule (Malladi et al., NeurIPS 2022, "On the SDEs and Scaling Rules for
Adaptive Gradient Algorithms"). With each micro-batch's loss divided by k the accumulated gradient is the
mean-loss gradient of the whole batch, so its norm does not grow with k and the clipping threshold stays
(⚠ the source's ``0.1·√k`` assumes summed losses); clip once, after the last micro-batch (and after
``scaler.unscale_`` under fp16). The validation guard lowers accumulation after ``patience`` rising
validation losses.

Taught in chapter 25 (adaptive accumulation and convergence safeguards).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from labkit import checks

__all__ = ["AccumController", "ValidationGuard", "scaled_lr", "simulate", "LR_RULES"]

LR_RULES = ("sqrt", "linear", "none")


@dataclass
class AccumController:
    """Chooses the accumulation of the next step from measured compute and communication seconds.

    ``observe(compute_s, comm_s, accum)`` after each step (``accum``: the accumulation that step ran with;
    the seconds come from the meter's phases — no extra synchronisation) returns the accumulation for the
    next step; ``log`` keeps (step, ratio, accumulation chosen). Taught in chapter 25.
    """

    window: int = 10
    cap: int = 8
    hysteresis: int = 2
    start: int = 1
    per: str = "micro_batch"
    accum: int = field(init=False)
    log: list = field(init=False, default_factory=list)

    def __post_init__(self):
        self.window = checks.count("AccumController.window", self.window)
        self.cap = checks.count("AccumController.cap", self.cap)
        self.hysteresis = checks.count("AccumController.hysteresis", self.hysteresis)
        self.start = checks.count("AccumController.start", self.start, at_most=self.cap)
        checks.one_of("AccumController.per", self.per, ("micro_batch", "step"))
        self.accum = self.start
        self._ratios: deque = deque(maxlen=self.window)
        self._steps = 0

    def ratio(self, compute_s: float, comm_s: float, accum: int) -> float:
        """Communication ÷ compute of one step, per micro-batch (or per step with ``per="step"``)."""
        compute_s = checks.positive("compute_s", compute_s)
        comm_s = checks.nonneg("comm_s", comm_s)
        accum = checks.count("accum", accum)
        return comm_s / (compute_s / accum if self.per == "micro_batch" else compute_s)

    def observe(self, compute_s: float, comm_s: float, accum: int | None = None) -> int:
        """Record one step's seconds; returns the accumulation for the next step."""
        r = self.ratio(compute_s, comm_s, self.accum if accum is None else accum)
        self._steps += 1
        self._ratios.append(r)
        if len(self._ratios) == self.window:
            want = min(self.cap, max(1, round(sum(self._ratios) / self.window)))
            if abs(want - self.accum) >= self.hysteresis:
                self.accum = want
                self._ratios.clear()           # the next decision sees only steps run at the new value
        self.log.append((self._steps, r, self.accum))
        return self.accum


def scaled_lr(base_lr: float, accum: int, base_accum: int = 1, *, rule: str = "sqrt") -> float:
    """The learning rate for a global batch ``accum / base_accum`` times the one ``base_lr`` was tuned for.

    ``rule="sqrt"``: × √(ratio), the square-root rule for Adam/AdamW (Malladi et al. 2022); ``"linear"``:
    × ratio, Goyal et al. 2017's rule for SGD with momentum (with warm-up); ``"none"``: unchanged.
    Taught in chapter 25.
    """
    base_lr = checks.positive("base_lr", base_lr)
    k = checks.count("accum", accum) / checks.count("base_accum", base_accum)
    checks.one_of("rule", rule, LR_RULES)
    return base_lr * (math.sqrt(k) if rule == "sqrt" else k if rule == "linear" else 1.0)


@dataclass
class ValidationGuard:
    """Lowers accumulation after ``patience`` validation losses in a row that rose (each above the one
    before it): ``update(val_loss, accum) -> accum``. Taught in chapter 25."""

    patience: int = 3
    floor: int = 1
    _last: float | None = field(init=False, default=None)
    _rises: int = field(init=False, default=0)
    triggered: list = field(init=False, default_factory=list)

    def __post_init__(self):
        self.patience = checks.count("ValidationGuard.patience", self.patience)
        self.floor = checks.count("ValidationGuard.floor", self.floor)

    def update(self, val_loss: float, accum: int) -> int:
        v = checks.number("val_loss", val_loss)
        accum = checks.count("accum", accum)
        self._rises = self._rises + 1 if (self._last is not None and v > self._last) else 0
        self._last = v
        if self._rises >= self.patience and accum > self.floor:
            self._rises = 0
            self.triggered.append((v, accum, max(self.floor, accum // 2)))
            return max(self.floor, accum // 2)
        return accum


def simulate(micro_compute_s, comm_s, *, steps: int = 40, **controller) -> list[tuple[int, float, int]]:
    """Run an :class:`AccumController` against a modelled step: compute = k × ``micro_compute_s(step)``,
    communication ``comm_s(step)`` once per step (floats or callables of the step index). Returns the
    controller's log. Taught in chapter 25 (why the ratio is taken per micro-batch)."""
    ctl = AccumController(**controller)
    steps = checks.count("steps", steps)
    f = (lambda v: v if callable(v) else (lambda i: v))
    mc, cm = f(micro_compute_s), f(comm_s)
    for i in range(steps):
        k = ctl.accum
        ctl.observe(k * mc(i), cm(i), k)
    return ctl.log
