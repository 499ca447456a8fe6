"""Numerics of mixed-precision training: the formats, the loss scale, and a gradient monitor.

- :func:`formats` — each floating-point format's range and precision, read from ``torch.finfo`` (tf32 has
  no torch dtype: it is fp32's 8-bit exponent with fp16's 10-bit mantissa, NVIDIA's A100 whitepaper);
  :func:`cast` shows what a value becomes in each format (overflow to inf, underflow to 0, rounding).
- **Loss scaling** (Micikevicius et al. 2018, "Mixed Precision Training", §3.2, arXiv:1710.03740): the
  loss is multiplied by S before backward so small gradients stay inside fp16's range, and the gradients
  are divided by S before the optimizer step. *Dynamic* scaling (``torch.amp.GradScaler``) starts at
  S = 65 536 (2¹⁶), halves S and skips the step when a gradient is inf/NaN, and doubles S after
  ``growth_interval`` steps in a row without one (torch/amp/grad_scaler.py, ``_amp_update_scale_``);
  :func:`replay_dynamic_scale` is that rule as a pure function, :func:`scaler_violations` holds a logged
  run to it. :class:`StaticScaler` is a fixed S applied every step, overflow or not — what diverges.
- :func:`grad_stats` — per-layer gradient statistics (norm, largest value, zeros, values fp16 cannot hold,
  inf/NaN) and a log₂ histogram, taken after backward and before unscaling, so they show the gradients the
  low-precision backward produced (× S); :func:`first_nonfinite` finds where a NaN first appeared.

- :func:`autocast_dtypes` — which modules autocast runs in the low-precision dtype on this device.

The trainer uses all of it: ``TrainConfig(dtype="fp16", loss_scale=…, grad_stats=True)``
(:mod:`labkit.train`). Taught in chapter 18 (mixed precision) and lab 7.
"""
from __future__ import annotations

import math

#: (name, torch dtype attribute) of the formats chapter 18 tabulates; tf32 is derived (no torch dtype)
FORMATS = (("fp32", "float32"), ("tf32", None), ("bf16", "bfloat16"), ("fp16", "float16"),
           ("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2"))
SOURCES = {
    "tf32": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), TF32: 8-bit exponent, 10-bit mantissa",
    "fp8_e4m3": "Micikevicius et al. 2022, FP8 Formats for Deep Learning, arXiv:2209.05433 (E4M3: max 448)",
    "fp8_e5m2": "Micikevicius et al. 2022, arXiv:2209.05433 (E5M2: max 57 344, IEEE-like inf/NaN)",
}
HIST_LO, HIST_HI = -40, 20          # log2 bins of the gradient histogram: [2^k, 2^(k+1)) for k in [LO, HI)
_WRAPPERS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")   # name parts


def _torch_dtype(name: str):
    import torch

    attr = dict(FORMATS).get(name, name)
    if attr is None:
        raise ValueError(f"{name} has no torch dtype (it is a matmul mode of fp32 tensors)")
    dt = getattr(torch, str(attr), None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"dtype={name!r} is not a floating-point format; choose one of {[f for f, _ in FORMATS]}")
    return dt


def format_info(name: str) -> dict:
    """One format's bits, exponent/mantissa bits, largest value, smallest normal and subnormal value,
    machine epsilon (the gap after 1.0) and decimal digits, from ``torch.finfo``. Taught in chapter 18."""
    import torch

    if name == "tf32":      # fp32's exponent (its range), fp16's 10 mantissa bits (its precision)
        f32, f16 = torch.finfo(torch.float32), torch.finfo(torch.float16)
        m = round(-math.log2(f16.eps))
        info = {"bits": 19, "max": (2 - 2.0 ** -m) * 2.0 ** 127, "smallest_normal": f32.smallest_normal,
                "eps": f16.eps}
    else:
        fi = torch.finfo(_torch_dtype(name))
        m = round(-math.log2(fi.eps))
        info = {"bits": fi.bits, "max": fi.max, "smallest_normal": fi.smallest_normal, "eps": fi.eps}
    info = {"format": name, **info, "mantissa_bits": m, "exponent_bits": info["bits"] - 1 - m}
    info["smallest_subnormal"] = info["smallest_normal"] * info["eps"]       # 2^(e_min − m)
    info["decimal_digits"] = math.log10(2.0 ** (m + 1))                      # significand bits × log10 2
    info["source"] = SOURCES.get(name, f"torch.finfo(torch.{dict(FORMATS).get(name, name)})")
    return info


def formats(names=tuple(f for f, _ in FORMATS)):
    """The formats' ranges and precision as a DataFrame (one row each; see :func:`format_info`).
    Taught in chapter 18."""
    import pandas as pd

    cols = ["format", "bits", "exponent_bits", "mantissa_bits", "max", "smallest_normal", "smallest_subnormal",
            "eps", "decimal_digits", "source"]
    return pd.DataFrame([format_info(n) for n in names])[cols]


def cast(values, names=("fp32", "bf16", "fp16", "fp8_e4m3")):
    """What each of ``values`` becomes when stored in each format (a DataFrame, one row per value): inf
    past the largest value, 0 below half the smallest subnormal, rounded to the format's mantissa
    otherwise. Taught in chapter 18."""
    import pandas as pd
    import torch

    x = torch.tensor([float(v) for v in values], dtype=torch.float64)
    out = {"value": x.tolist()}
    for n in names:
        dt = _torch_dtype(n)
        # fp8 from fp32 (torch casts to float8 from float32); e4m3fn has no inf: torch's cast saturates at 448
        src = x.to(torch.float32) if "float8" in str(dt) else x
        out[n] = src.to(dt).to(torch.float64).tolist()
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------ loss scaling
def replay_dynamic_scale(overflows, *, init: float = 65536.0, growth_interval: int = 2000,
                         backoff: float = 0.5, growth: float = 2.0) -> list[float]:
    """The scale each step uses under dynamic loss scaling, given which steps overflowed: after an
    overflow ×``backoff`` (the step is skipped); after ``growth_interval`` clean steps in a row ×``growth``
    (torch/amp/grad_scaler.py ``update`` → ``_amp_update_scale_``). Taught in chapter 18."""
    from labkit import checks

    scale = checks.positive("init", init)
    checks.count("growth_interval", growth_interval)
    scales, clean = [], 0
    for o in overflows:
        scales.append(scale)
        if o:
            scale, clean = scale * backoff, 0
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * growth, 0
    return scales


def scaler_violations(log, *, init: float, growth_interval: int, backoff: float = 0.5,
                      growth: float = 2.0) -> list[str]:
    """Where a loss-scale log (``record.extra["loss_scale_log"]``: one row per step with ``scale``,
    ``overflow``, ``applied``, ``next_scale``) breaks dynamic loss scaling: a skipped step that did not
    overflow or an applied one that did, a scale that does not follow :func:`replay_dynamic_scale`.
    Empty when the log is the rule. Taught in chapter 18 and lab 7 (the grader re-derives the log)."""
    bad = []
    if not log:
        return ["the log is empty"]
    want = replay_dynamic_scale([bool(r["overflow"]) for r in log], init=init, growth_interval=growth_interval,
                                backoff=backoff, growth=growth)
    for i, (r, s) in enumerate(zip(log, want, strict=True)):
        if not math.isclose(float(r["scale"]), s, rel_tol=1e-9):
            bad.append(f"step {i}: scale {r['scale']:g}, the rule gives {s:g}")
        if bool(r["applied"]) == bool(r["overflow"]):
            bad.append(f"step {i}: overflow={bool(r['overflow'])} but applied={bool(r['applied'])} "
                       "(an overflowing step is skipped, a clean one applied)")
        if i + 1 < len(log) and not math.isclose(float(r["next_scale"]), float(log[i + 1]["scale"]), rel_tol=1e-9):
            bad.append(f"step {i}: next_scale {r['next_scale']:g} is not step {i + 1}'s scale {log[i + 1]['scale']:g}")
    return bad


class StaticScaler:
    """A fixed loss scale S, GradScaler's interface: ``scale(loss)`` = loss·S, ``unscale_`` divides the
    gradients by S, ``step`` always steps (an inf gradient reaches the optimizer: the run diverges),
    ``update`` keeps S. What "static loss scaling" (Micikevicius et al. 2018, §3.2) does without a check.
    Taught in chapter 18 and lab 7."""

    def __init__(self, scale: float):
        from labkit import checks

        self._scale = checks.positive("loss_scale", scale)
        self._unscaled = False

    def scale(self, loss):
        return loss * self._scale

    def unscale_(self, optimizer) -> None:
        if not self._unscaled:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.div_(self._scale)
            self._unscaled = True

    def step(self, optimizer):
        self.unscale_(optimizer)
        return optimizer.step()

    def update(self) -> None:
        self._unscaled = False

    def get_scale(self) -> float:
        return self._scale


def optimizer_steps(optimizer) -> int:
    """How many steps the optimizer has applied (Adam's per-parameter ``step`` counter; 0 before the
    first) — independent evidence of whether a step was skipped. Taught in chapter 18."""
    for state in optimizer.state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def nonfinite_grads(model) -> bool:
    """Whether any gradient value of ``model`` is inf or NaN: the total norm of all gradients is finite
    exactly when every value is (one fused norm and one host sync, as GradScaler's own check). Taught in
    chapter 18."""
    import torch

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(grads) and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))


# --------------------------------------------------------------------------------------- gradient monitor
def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its name without wrapper prefixes (DDP ``module.``, compile,
    checkpointing, FSDP1) and without ``.weight``/``.bias``. Taught in chapter 18."""
    name = ".".join(part for part in name.split(".") if part not in _WRAPPERS)
    if name in ("weight", "bias"):          # a bare module's own parameters
        return "(root)"
    return name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name


def grad_stats(model, *, scale: float = 1.0, fmt: str = "fp16") -> list[dict]:
    """Per-layer statistics of ``model``'s gradients as they are now (call after backward, before
    unscaling): ``numel``, ``norm``, ``max_abs``, ``zeros`` (share exactly 0), ``subnormal`` (share
    nonzero but below ``fmt``'s smallest normal: precision lost), ``nonfinite`` (count of inf/NaN),
    ``scale`` (the loss scale they carry), and ``hist`` — counts of |g| in [2^k, 2^(k+1)) for
    k = HIST_LO … HIST_HI−1 (values outside are clipped into the end bins; zeros and inf/NaN are not
    counted). Taught in chapter 18 (NaN hunting with gradient statistics)."""
    import numpy as np

    tiny = format_info(fmt)["smallest_normal"]
    layers: dict[str, list] = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.detach()
            g = g.to_local() if hasattr(g, "to_local") else g       # FSDP2: this rank's shard
            layers.setdefault(layer_of(name), []).append(g.reshape(-1).float().cpu().numpy())
    rows = []
    for layer, parts in layers.items():     # NumPy on the host: one pass, no thread pool to contend for
        a = np.abs(np.concatenate(parts))
        finite = np.isfinite(a)
        fa = a[finite]
        nz = fa[fa > 0]
        k = np.clip(np.floor(np.log2(nz)), HIST_LO, HIST_HI - 1).astype(np.int64) - HIST_LO
        hist = np.bincount(k, minlength=HIST_HI - HIST_LO)
        n = a.size
        rows.append({"layer": layer, "numel": int(n), "scale": float(scale),
                     "norm": float(np.sqrt(np.sum(fa.astype(np.float64) ** 2))),
                     "max_abs": float(fa.max()) if fa.size else 0.0,
                     "zeros": float(fa.size - nz.size) / n, "subnormal": float((nz < tiny).sum()) / n,
                     "nonfinite": int(n - finite.sum()), "hist": [int(v) for v in hist]})
    return rows


def stats_frame(steps):
    """``record.extra["grad_stats"]`` (a list per step of :func:`grad_stats` rows) as one DataFrame with a
    ``step`` column and without the histograms. Taught in chapter 18."""
    import pandas as pd

    return pd.DataFrame([{"step": i, **{k: v for k, v in r.items() if k != "hist"}}
                         for i, rows in enumerate(steps) for r in rows])


def first_nonfinite(steps) -> tuple[int, list[str]] | None:
    """(step, layers) where inf/NaN gradients first appeared in ``record.extra["grad_stats"]``, or None
    when every gradient stayed finite. Taught in chapter 18 (NaN hunting)."""
    for i, rows in enumerate(steps):
        bad = [r["layer"] for r in rows if r["nonfinite"]]
        if bad:
            return i, bad
    return None


def hist_edges() -> list[float]:
    """The log2 exponents k of :func:`grad_stats`'s histogram bins [2^k, 2^(k+1)). Taught in chapter 18."""
    return list(range(HIST_LO, HIST_HI))


def autocast_dtypes(model, *inputs, dtype: str = "fp16", device_type: str = "cpu"):
    """What autocast does to each module of ``model`` on one forward of ``model(*inputs)``: a DataFrame
    of module name, type and output dtype (forward hooks on every module without children), with the
    returned loss last when the model returns one. Autocast's op lists differ by device: on CUDA
    ``layer_norm`` and ``softmax`` run in fp32, on CPU they keep the low-precision dtype (accumulating in
    fp32 inside the kernel); both compute ``cross_entropy`` in fp32 (https://pytorch.org/docs/stable/amp.html).
    Taught in chapter 18."""
    import pandas as pd
    import torch

    rows, hooks = [], []

    def hook(name):
        def record(module, args, out):
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, torch.Tensor):
                rows.append({"module": name, "type": type(module).__name__, "output dtype": str(t.dtype)[6:]})
        return record

    for name, m in model.named_modules():
        if name and not list(m.children()):
            hooks.append(m.register_forward_hook(hook(name)))
    try:
        with torch.no_grad(), torch.autocast(device_type=device_type, dtype=_torch_dtype(dtype)):
            out = model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    loss = out[1] if isinstance(out, tuple) and len(out) > 1 else None
    if isinstance(loss, torch.Tensor):
        rows.append({"module": "(loss)", "type": "cross_entropy", "output dtype": str(loss.dtype)[6:]})
    return pd.DataFrame(rows)
