"""What throughput costs: wall-clock, device-hours, energy and money of a training run.

The arithmetic is simple and that is the point of chapter 1 — time is work divided by rate:

    total FLOPs      = tokens × FLOPs per token           (6·N per token; Kaplan et al. 2020, §2.1)
    achieved FLOP/s  = MFU × peak × devices               (PaLM, Chowdhery et al. 2022, App. B)
    tokens/s         = achieved FLOP/s / FLOPs per token
    wall-clock       = tokens / tokens/s ;  device-hours = wall-clock × devices / 3600

Because wall-clock is 1/throughput, a throughput drop ``d`` costs ``1/(1-d) - 1`` more time:
a 30% drop is 43% more wall-clock (and device-hours, and money), not 30%.

Taught in chapter 1 (``chapters/part1_cognition/ch01_why_throughput.ipynb``); reused in chapter 28
(cost and regression monitoring).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks
from labkit.perf.steptime import tokens_per_s_at  # noqa: F401 - taught in chapter 1

__all__ = ["extra_wallclock_fraction", "wallclock_s", "tokens_per_s_at", "training_cost", "TrainingCost",
           "throughput_for_deadline", "device_choice"]


def extra_wallclock_fraction(throughput_drop: float) -> float:
    """Extra wall-clock (as a fraction) caused by a relative throughput drop.

    ``throughput_drop`` is a fraction in [0, 1): 0.30 means 30% fewer tokens/s. Time ∝ 1/throughput,
    so the run takes ``1/(1 - drop) - 1`` longer: 0.30 → 0.4286. Taught in chapter 1.
    """
    d = checks.nonneg("throughput_drop", throughput_drop)
    if d >= 1:
        raise ValueError(f"throughput_drop must be a fraction in [0, 1), got {throughput_drop!r} "
                         "(a 100% drop never finishes; give 0.3 for 30%)")
    return checks.finite_result("extra wall-clock", 1.0 / (1.0 - d) - 1.0, throughput_drop=throughput_drop)


def wallclock_s(tokens: float, tokens_per_s: float) -> float:
    """Seconds to process ``tokens`` at a global throughput of ``tokens_per_s``. Taught in chapter 1."""
    t = checks.positive("tokens", tokens) / checks.positive("tokens_per_s", tokens_per_s)
    return checks.finite_result("wall-clock seconds", t, tokens=tokens, tokens_per_s=tokens_per_s)


def throughput_for_deadline(tokens: float, days: float) -> float:
    """Global tokens/s needed to finish ``tokens`` in ``days`` of wall-clock. Taught in chapter 1."""
    x = checks.positive("tokens", tokens) / (checks.positive("days", days) * 86400.0)
    return checks.finite_result("tokens/s", x, tokens=tokens, days=days)


@dataclass(frozen=True)
class TrainingCost:
    """The cost of one training run (see :func:`training_cost`)."""

    tokens: float
    total_flops: float
    tokens_per_s: float
    n_devices: int
    wall_s: float
    device_hours: float
    cost: float | None           # in the currency of price_per_device_hour
    energy_kwh: float | None     # device power × PUE × time

    @property
    def days(self) -> float:
        return self.wall_s / 86400.0

    @property
    def cost_per_million_tokens(self) -> float | None:
        return None if self.cost is None else self.cost / (self.tokens / 1e6)

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "total FLOPs": self.total_flops, "tokens/s (global)": self.tokens_per_s,
                "devices": self.n_devices, "wall-clock days": self.days, "device-hours": self.device_hours,
                "cost": self.cost, "energy kWh": self.energy_kwh}

    def summary(self) -> str:
        s = (f"{self.tokens:.3g} tokens × {self.total_flops / self.tokens:.3g} FLOP/token = "
             f"{self.total_flops:.3g} FLOPs; {self.tokens_per_s:,.0f} tok/s on {self.n_devices} devices → "
             f"{self.days:,.1f} days, {self.device_hours:,.0f} device-hours")
        if self.cost is not None:
            s += f", cost {self.cost:,.0f}"
        if self.energy_kwh is not None:
            s += f", {self.energy_kwh / 1e3:,.0f} MWh"
        return s


def training_cost(*, tokens: float, flops_per_token: float, n_devices: int, peak_flops: float | None = None,
                  mfu: float | None = None, tokens_per_s: float | None = None,
                  price_per_device_hour: float | None = None, device_power_w: float | None = None,
                  pue: float = 1.0) -> TrainingCost:
    """Wall-clock, device-hours, cost and energy of training on ``tokens``.

    Give either a measured global ``tokens_per_s``, or ``mfu`` and ``peak_flops`` (per device) to
    derive it with :func:`tokens_per_s_at`. ``price_per_device_hour`` and ``device_power_w`` are
    optional (your cloud price and the device's board power, e.g. 700 W for an H100 SXM);
    ``pue`` is the data centre's power usage effectiveness (≥ 1). Taught in chapter 1; used in chapter 28.
    """
    tokens = checks.positive("tokens", tokens)
    fpt = checks.positive("flops_per_token", flops_per_token)
    n_devices = checks.count("n_devices", n_devices)
    # every given argument is checked, used or not (a bad pue without device_power_w is still a mistake)
    price = None if price_per_device_hour is None else checks.nonneg("price_per_device_hour", price_per_device_hour)
    power = None if device_power_w is None else checks.positive("device_power_w", device_power_w)
    p = checks.number("pue", pue, low=1)   # 1.0 = no cooling overhead
    if mfu is not None:
        checks.number("mfu", mfu)
    if peak_flops is not None:
        checks.positive("peak_flops", peak_flops)
    if tokens_per_s is None:
        if mfu is None or peak_flops is None:
            raise ValueError("give tokens_per_s, or both mfu and peak_flops (got "
                             f"tokens_per_s=None, mfu={mfu!r}, peak_flops={peak_flops!r})")
        tps = tokens_per_s_at(mfu=mfu, peak_flops=peak_flops, n_devices=n_devices, flops_per_token=fpt)
    else:
        if mfu is not None:
            raise ValueError("give tokens_per_s or mfu, not both")
        tps = checks.positive("tokens_per_s", tokens_per_s)
    given = dict(tokens=tokens, flops_per_token=flops_per_token, n_devices=n_devices, tokens_per_s=tps)
    wall = checks.finite_result("wall-clock seconds", tokens / tps, **given)
    total = checks.finite_result("total FLOPs", tokens * fpt, **given)
    dev_h = checks.finite_result("device-hours", wall * n_devices / 3600.0, **given)
    cost = None if price is None else checks.finite_result("cost", dev_h * price,
                                                            price_per_device_hour=price_per_device_hour, **given)
    energy = None if power is None else checks.finite_result("energy kWh", power * n_devices * wall * p / 3.6e6,
                                                              device_power_w=device_power_w, pue=pue, **given)
    return TrainingCost(tokens=tokens, total_flops=total, tokens_per_s=tps, n_devices=n_devices,
                        wall_s=wall, device_hours=dev_h, cost=cost, energy_kwh=energy)


def device_choice(*, tokens: float, flops_per_token: float, mfu: float, n_devices: int, devices=None,
                  dtype: str = "bf16", reference: str = "H100-SXM", prices: dict | None = None) -> list[dict]:
    """The same token budget on catalogued parts (:mod:`labkit.hardware.catalogue`), at one assumed ``mfu``.

    One row per part: its dense ``dtype`` peak, tokens/s, wall-clock days and device-hours on ``n_devices``
    (:func:`training_cost`), and
    ``break_even_price_ratio``: at equal MFU the part costs less per token than the reference exactly when
    its hourly price is below this multiple of the reference's — cost/token = price × device-hours / tokens,
    and device-hours scale as 1/peak. With ``prices`` ({part: price per device-hour}, *your* prices) each
    priced row also gets ``cost`` and ``cost_per_million_tokens``. ``devices``: catalogue names (default:
    every part with a ``dtype`` peak). Equal MFU across parts is the assumption to question: a part short
    of memory or bandwidth reaches a lower MFU. Taught in chapter 28 (cost and regression monitoring).
    """
    from labkit.hardware import catalogue

    tokens = checks.positive("tokens", tokens)
    fpt = checks.positive("flops_per_token", flops_per_token)
    mfu = checks.number("mfu", mfu, low=0, high=1, low_open=True)
    n_devices = checks.count("n_devices", n_devices)

    def part(param, name):
        try:
            return catalogue.lookup(name)
        except checks.ArgumentTypeError as e:
            raise checks.ArgumentTypeError(f"{param}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{param}: {e}") from None

    try:
        dkey = catalogue.normalize_dtype(dtype)
    except checks.ArgumentTypeError as e:
        raise checks.ArgumentTypeError(f"dtype: {e}") from None
    ref_peak = part("reference", reference).peak(dkey)
    if devices is None:
        names = [n for n, sp in catalogue.CATALOGUE.items() if dkey in sp.peak_flops]
    else:
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
            raise checks.ArgumentTypeError(f"devices must be a list of catalogue names, got {devices!r:.60}")
        names = [part(f"devices[{i}]", d).name for i, d in enumerate(devices)]
    if prices is not None:
        if not isinstance(prices, dict):
            raise checks.ArgumentTypeError(f"prices must be a dict {{part: price per device-hour}}, got "
                                           f"{type(prices).__name__}")
        prices = {part(f"prices key {k!r}", k).name: checks.nonneg(f"prices[{k!r}]", v) for k, v in prices.items()}
    rows = []
    for name in names:
        peak = catalogue.lookup(name).peak(dkey)
        price = None if prices is None else prices.get(name)
        tc = training_cost(tokens=tokens, flops_per_token=fpt, n_devices=n_devices, peak_flops=peak, mfu=mfu,
                           price_per_device_hour=price)
        row = {"device": name, "peak_tflops": peak / 1e12, "tokens_per_s": tc.tokens_per_s, "days": tc.days,
               "device_hours": tc.device_hours,
               "break_even_price_ratio": peak / ref_peak}
        if price is not None:
            row |= {"price_per_device_hour": price, "cost": tc.cost,
                    "cost_per_million_tokens": checks.finite_result("cost per million tokens", tc.cost / tokens * 1e6,
                                                                    tokens=tokens, price=price)}
        rows.append(row)
    return rows
