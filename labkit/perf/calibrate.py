"""The performance model's achievable fraction, calibrated from one measured run instead of assumed.

:func:`labkit.perf.predict` prices compute at an *achievable fraction* of the dense peak. Its default,
50 %, is an assumption; a better one comes from **one run of the same model family on the same GPU**
— a published throughput (tokens/s per GPU) or a labkit :class:`~labkit.record.RunRecord` from a GPU
job — by solving the model for the fraction that reproduces that run. The fraction then carries to
other layouts, scales and sequence lengths of the family: what changes between them (bubble, TP/PP/DP
communication, stage imbalance) is priced by the model's terms, not absorbed into the number.

The solve is monotone: a higher fraction shortens only the compute (and the bubble, a share of it),
so the predicted tokens/s rises with it; bisection finds the fraction to 1e-6. A run the model cannot
reach even at 100 % of the peak (its communication alone is slower than the run) is refused with the
figures, as is a run faster than the peak allows.

Taught in chapter 24 (choosing a parallel layout: how far to trust the model) and chapter 29 (the case's
calibration from its own 64-GPU run).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["Calibration", "calibrate_achievable"]


@dataclass(frozen=True)
class Calibration:
    """A fraction of the dense peak solved from one run: ``achievable`` (for :func:`labkit.perf.predict`),
    the run it came from (``source``, its ``tokens_per_s_per_gpu``) and the prediction at that fraction.

    Taught in chapter 24."""

    achievable: float
    tokens_per_s_per_gpu: float
    source: str
    prediction: object

    def describe(self) -> str:
        """One line: the fraction, the run it reproduces and where that run's figure comes from."""
        lay = self.prediction.layout
        return (f"achievable {self.achievable:.1%} of the {lay.dtype} dense peak, solved from {self.source}: "
                f"{self.tokens_per_s_per_gpu:,.0f} tokens/s per GPU ({self.prediction.model}, {lay.describe()}, "
                f"{self.prediction.n_gpus} GPUs)")


def calibrate_achievable(model, layout, cluster, *, global_batch: int, tokens_per_s_per_gpu: float,
                         source: str, seq_len: int | None = None, **predict_kw) -> Calibration:
    """Solve :func:`labkit.perf.predict` for the achievable fraction at which ``layout`` on ``cluster``
    runs at the measured ``tokens_per_s_per_gpu`` (a published figure, or ``RunRecord.tokens_per_s`` ÷
    its GPUs). ``source`` says where the figure comes from (a citation or a record's path) and is
    printed with every prediction that uses the result. ``predict_kw`` go to ``predict`` unchanged
    (``method``, ``dp_overlap``, ``sync_s``…), so calibrate and predict with the same settings.

    Taught in chapter 24 (calibrating the performance model) and chapter 29."""
    from labkit.perf.predict import predict

    target = checks.positive("tokens_per_s_per_gpu", tokens_per_s_per_gpu)
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"source must say where the measured figure comes from (a citation or a record), "
                         f"got {source!r}")
    if "achievable" in predict_kw:
        raise ValueError("achievable is what calibrate_achievable solves for: do not pass it")

    def rate(frac: float):
        pr = predict(model, layout, cluster, global_batch=global_batch, seq_len=seq_len, achievable=frac,
                     **predict_kw)
        return pr.tokens_per_s_per_gpu, pr

    top, best = rate(1.0)
    if target > top:
        raise ValueError(f"tokens_per_s_per_gpu={target:,.6g} is faster than the model allows even at 100 % of the "
                         f"peak ({top:,.6g} tokens/s per GPU for {layout.describe()}): check the layout, the "
                         f"GPU and the sequence length of the run ({source})")
    low_rate, _ = rate(1e-3)
    if target < low_rate:
        raise ValueError(f"tokens_per_s_per_gpu={target:,.6g} is slower than the model gives at 0.1 % of the peak "
                         f"({low_rate:,.6g}): the run is not compute-limited in any way the model prices ({source})")
    lo, hi = 1e-3, 1.0
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        r, _ = rate(mid)
        if r < target:
            lo = mid
        else:
            hi = mid
    _, pr = rate(hi)
    return Calibration(achievable=hi, tokens_per_s_per_gpu=target, source=source.strip(), prediction=pr)
