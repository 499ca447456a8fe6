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
Adam-type optimisers the learning rate × √k, a heuristic after the square-root scaling rule of Malladi et al.
(NeurIPS 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms"), whose rule also moves 1 − β₁,
1 − β₂ (× k) and ε (÷ √k); at a fixed global batch the learning rate stays. With each micro-batch's loss divided by k the accumulated gradient is the
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
from labkit.train.config import LR_RULES  # the rules TrainConfig validates accum_lr_rule against

__all__ = ["AccumController", "ValidationGuard", "AdaptiveRun", "scaled_lr", "simulate", "held_out",
           "LR_RULES"]



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

    def force(self, accum: int) -> int:
        """Set the accumulation from outside (the validation guard); the window starts again."""
        self.accum = checks.count("accum", accum, at_most=self.cap)
        self._ratios.clear()
        return self.accum


def scaled_lr(base_lr: float, accum: int, base_accum: int = 1, *, rule: str = "sqrt") -> float:
    """The learning rate for a global batch ``accum / base_accum`` times the one ``base_lr`` was tuned for.

    ``rule="sqrt"``: × √(ratio), for Adam/AdamW — the learning-rate part of Malladi et al. 2022's square-root
    rule, which also rescales β₁, β₂ and ε (left as they are here: a heuristic); ``"linear"``:
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


def held_out(cfg, dataset=None):
    """(training dataset, held-out windows) of ``cfg``: with ``val_every`` the corpus' last
    ``val_sequences`` windows are held out and never trained on (training sees the others, in the same
    seeded order); without it, (the whole corpus, None). ``train_sequences`` keeps the first N windows only.
    ``dataset``: the run's windows (default: the packed pre-tokenised corpus). Taught in chapter 25 (the validation guard)."""
    import torch

    from labkit import data

    full = dataset if dataset is not None else data.TokenDataset(data.load_tokens(), cfg.model_config.seq_len)
    n = len(full)
    if not cfg.val_every:
        return (full if cfg.train_sequences is None else torch.utils.data.Subset(full, range(cfg.train_sequences))), None
    if cfg.val_sequences >= n // 2:
        raise ValueError(f"TrainConfig.val_sequences={cfg.val_sequences} would hold out half or more of the "
                         f"corpus' {n} windows: use fewer")
    keep = n - cfg.val_sequences
    xs, ys = zip(*(full[i] for i in range(keep, n)), strict=True)
    train = range(keep if cfg.train_sequences is None else min(keep, cfg.train_sequences))
    return torch.utils.data.Subset(full, train), (torch.stack(xs), torch.stack(ys))


class AdaptiveRun:
    """What :func:`labkit.train.loop.train` does between steps for chapter 25, in one place: the
    accumulation of each step (fixed, or chosen by an :class:`AccumController` from the meter's
    forward + backward and comm phases), the learning rate that follows it (:func:`scaled_lr`), the
    held-out evaluation every ``val_every`` steps, the :class:`ValidationGuard` and the SWA average.

    Ranks must run the same accumulation: each measured step's (compute, comm) seconds are averaged over
    ranks by one host-side all-reduce of two floats (a gloo group on CUDA, so the device never waits).
    Taught in chapter 25.
    """

    def __init__(self, cfg, model, opt, device, val, world_size: int, autocast=None):
        import contextlib

        self.cfg, self.model, self.opt, self.device, self.val = cfg, model, opt, device, val
        self._autocast = autocast or contextlib.nullcontext     # the loop's autocast for the held-out forward
        self.ctl = (AccumController(window=cfg.accum_window, cap=cfg.accum_cap, hysteresis=cfg.accum_hysteresis,
                                    start=cfg.accum_start) if cfg.adaptive else None)
        self.guard = ValidationGuard(patience=cfg.val_patience) if (cfg.adaptive and val is not None) else None
        self.ks: list[int] = []
        self.lrs: list[float] = []
        self._norms: list = []                   # gradient norms before clipping (tensors: no sync per step)
        self.val_log: list[dict] = []
        self._swa, self._swa_n = None, 0
        self._group = None
        if self.ctl is not None and world_size > 1:
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo") if device.type == "cuda" else dist.group.WORLD
        self._lag = 1 if device.type == "cuda" else 0
        self._mb_tokens = cfg.micro_batch * world_size * cfg.model_config.seq_len   # one micro-batch, all ranks

    @property
    def accum(self) -> int:
        return self.ctl.accum if self.ctl is not None else self.cfg.accum

    def before_step(self) -> int:
        """The accumulation of the step about to run; sets the learning rate for it."""
        k = self.accum
        if self.ctl is not None:
            lr = scaled_lr(self.cfg.lr, k, self.cfg.accum_start, rule=self.cfg.accum_lr_rule)
            for g in self.opt.param_groups:
                g["lr"] = lr
        self.ks.append(k)
        self.lrs.append(float(self.opt.param_groups[0]["lr"]))
        return k

    def after_step(self, i: int, meter) -> None:
        """Between steps: feed the controller, evaluate the held-out split, update the weight average."""
        cfg = self.cfg
        j = i - self._lag
        if self.ctl is not None and j >= cfg.warmup_steps:
            ph = meter.recent(self._lag) or {}
            times = [ph.get("forward", 0.0) + ph.get("backward", 0.0), ph.get("comm", 0.0)]
            if self._group is not None:
                import torch
                import torch.distributed as dist

                t = torch.tensor(times, dtype=torch.float64)
                dist.all_reduce(t, group=self._group)
                times = (t / dist.get_world_size()).tolist()
            if times[0] > 0:
                self.ctl.observe(times[0], times[1], self.ks[j])
        if cfg.swa_start is not None and i >= cfg.swa_start:
            self._average()
        if self.val is not None and (i + 1) % cfg.val_every == 0:
            row = {"step": i, "tokens": self.tokens_seen(), "val_loss": self._evaluate(), "accum": self.ks[i]}
            if self._swa is not None:
                row["swa_val_loss"] = self._evaluate(self._swa)
            if self.guard is not None:
                k = self.guard.update(row["val_loss"], self.ctl.accum)
                if k != self.ctl.accum:
                    self.ctl.force(k)
                    row["guard_lowered_to"] = k
            self.val_log.append(row)

    def clip(self, scaler=None) -> None:
        """Clip the global gradient norm to ``max_grad_norm`` — once per step, after the last micro-batch,
        after ``scaler.unscale_`` (GradScaler then does not unscale twice); the norm before clipping is kept."""
        import torch

        if scaler is not None:
            scaler.unscale_(self.opt)
        own = getattr(self.model, "clip_grad_norm_", None)          # FSDP1 clips its shards itself
        norm = (own(self.cfg.max_grad_norm) if own is not None
                else torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm))
        self._norms.append(norm.detach() if hasattr(norm, "detach") else torch.tensor(float(norm)))

    def tokens_seen(self) -> int:
        """Global tokens trained on so far (every rank's micro-batches of every step)."""
        return sum(self.ks) * self._mb_tokens

    def _module(self):
        return getattr(getattr(self.model, "_orig_mod", self.model), "module", self.model)

    def _average(self) -> None:
        import torch

        params = [p.detach() for p in self._module().parameters()]
        self._swa_n += 1
        if self._swa is None:
            self._swa = [p.float().clone() for p in params]
            return
        with torch.no_grad():
            for a, p in zip(self._swa, params, strict=True):
                a += (p.float() - a) / self._swa_n

    def _evaluate(self, weights=None) -> float:
        """Mean loss on the held-out windows (eval mode, no gradients); ``weights`` swapped in for it."""
        import torch

        from labkit.train.tensor_parallel import local_loss, loss_context

        net = self._module() if weights is not None else self.model
        params = list(self._module().parameters())
        saved = [p.detach().clone() for p in params] if weights is not None else None
        x, y = (t.to(self.device) for t in self.val)
        was = net.training
        net.eval()
        try:
            with torch.no_grad():
                if weights is not None:
                    for p, w in zip(params, weights, strict=True):
                        p.copy_(w)
                with self._autocast(), loss_context(net):     # tp: the vocabulary-parallel loss
                    _, loss = net(x, y)
                return float(local_loss(loss).float())
        finally:
            if saved is not None:
                with torch.no_grad():
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
            net.train(was)

    def extra(self, meter=None) -> dict:
        """What the record keeps: each step's accumulation, tokens and time, the controller's log,
        validations, gradient norms."""
        out = {}
        if self._norms:
            out["grad_norm_per_step"] = [float(v) for v in self._norms[-self.cfg.steps:]]
        if self.ctl is None and self.val is None:
            return out
        if meter is not None:
            out["step_s_measured"] = meter.step_times            # the steps after warm-up, in order
        out |= {"accum_per_step": list(self.ks), "tokens_per_step_each": [k * self._mb_tokens for k in self.ks],
               "lr_per_step": list(self.lrs)}
        if self.ctl is not None:
            out["accum_controller"] = {"log": [list(r) for r in self.ctl.log], "window": self.ctl.window,
                                       "cap": self.ctl.cap, "hysteresis": self.ctl.hysteresis,
                                       "lr_rule": self.cfg.accum_lr_rule}
        if self.val_log:
            out["val_log"] = self.val_log
        return out

