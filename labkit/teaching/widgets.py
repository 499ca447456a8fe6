"""Interactive calculators for the chapters, with a static fallback.

A :class:`Calculator` is a pure function of named inputs (``fn(**inputs) -> {output: value}``) plus
the sliders that drive it. ``show()`` displays ipywidgets sliders when they can run, and *always* prints
a static table of the outputs at the default inputs and a few variations — so the numbers are there
when widgets cannot render (papermill, nbconvert/HTML, a viewer without the widget manager, or
``LABKIT_WIDGETS=0`` in the environment).

    calc = widgets.cost_calculator()      # chapter 1
    calc.show()                           # sliders + static table
    calc.compute(mfu=0.3)                 # the same maths, no UI

The sliders start exactly on the table's "defaults" row: both come from one ``compute`` at the same
inputs and one formatter (:meth:`Calculator.formatted`). A browser snaps a slider's starting value to
its step grid and sends the snapped value back, so a linear slider is only stepped when its default lies
on the grid; a log slider's grid is laid through its default (its minimum moves up by less than one
step), so it always has a keyboard step (0.01 decade, ×1.023 a press) rather than noUiSlider's 10 % of
the range. A value that comes back within rounding of the one the kernel holds (``10**log10(x)`` is not
always ``x``) is read as that value. Before the kernel runs (a stored notebook in JupyterLab, where the
widget front end waits for a kernel), the widget's output shows a static HTML rendering of the same
defaults, and the table is an HTML table, which wraps inside its cells.

Written for Part I: the cost calculator (chapter 1), the MFU calculator (chapter 4), the scaling
calculator (chapter 5); other chapters build their own with :class:`Calculator`.
"""
from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Param", "Calculator", "widgets_available", "cost_calculator", "mfu_calculator",
           "scaling_calculator"]


@dataclass(frozen=True)
class Param:
    """One input: a slider between ``min`` and ``max`` (log scale when ``log``), or a choice of ``options``.

    ``step`` (in the exponent for a log slider; 0.01 by default) applies to a linear slider only when
    ``value`` lies on the step grid from ``min``, otherwise the slider is continuous, so that it starts
    exactly on ``value``; a log slider's grid is laid through ``value`` (:meth:`log_grid`). ``readout`` is the
    slider's number format (d3-format, as ipywidgets uses); by default trimmed significant digits — four,
    or five for ranges past 10⁴ (``989.5``, ``0.4``, ``15600``, ``4.8e+10``) — with no separators or
    SI prefixes, so that a learner can edit the readout.

    Taught in chapter 1 (the cost calculator is built from them)."""

    name: str
    label: str
    value: float | int | str
    min: float = 0.0
    max: float = 1.0
    step: float | None = None
    log: bool = False
    integer: bool = False
    options: tuple = ()
    readout: str | None = None

    def __post_init__(self):
        if self.readout is not None and (not isinstance(self.readout, str) or not self.readout):
            raise ValueError(f"Param {self.name}: readout must be a non-empty d3-format string such as "
                             f"'.2f', got {self.readout!r}")
        if self.step is not None and not self.options and (
                isinstance(self.step, bool) or not isinstance(self.step, numbers.Real)
                or not (math.isfinite(self.step) and self.step > 0)):
            raise ValueError(f"Param {self.name}: step must be a finite number > 0, got {self.step!r}")
        if self.options:
            if self.value not in self.options:
                raise ValueError(f"Param {self.name}: value {self.value!r} not in options {self.options}")
            return
        if not (self.min <= self.value <= self.max):
            raise ValueError(f"Param {self.name}: value {self.value!r} outside [{self.min}, {self.max}]")
        if self.log and self.min <= 0:
            raise ValueError(f"Param {self.name}: a log slider needs min > 0, got {self.min!r}")

    def validate(self, v):
        if self.options:
            if v not in self.options:
                raise ValueError(f"{self.name} must be one of {self.options}, got {v!r}")
            return v
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{self.name} must be a number, got {type(v).__name__} {v!r}") from None
        if not (self.min <= x <= self.max) or not math.isfinite(x):
            raise ValueError(f"{self.name} must be in [{self.min}, {self.max}], got {v!r}")
        return int(round(x)) if self.integer else x

    def readout_format(self) -> str:
        """The slider's d3-format: ``readout`` if given, else one chosen from the range (see the class)."""
        if self.readout:
            return self.readout
        if self.integer:
            return "d"
        return ".5" if self.max > 1e4 else ".4"     # no type: d3's ~g, trailing zeros trimmed

    def slider_step(self) -> float | None:
        """``step`` when ``value`` is on its grid (a browser then keeps the value), else None (continuous)."""
        if self.options:
            return None
        step = self.step if self.step is not None else (0.01 if self.log else None)
        if self.integer:
            step = int(step or 1)
        if step is None:
            return None
        offset = (math.log10(self.value) - math.log10(self.min)) if self.log else (self.value - self.min)
        k = offset / step
        return step if abs(k - round(k)) <= 1e-6 else (1 if self.integer else None)

    def log_grid(self) -> tuple[float, float, float]:
        """(min, max, step) exponents of a log slider: a grid of ``step`` from a min moved up from
        ``log10(min)`` by less than one step so that it passes through ``log10(value)`` — a browser then
        keeps the value, and each arrow key moves it by ``step`` (×10^step). Chapter 1."""
        step = self.step if self.step is not None else 0.01
        lo, v = math.log10(self.min), math.log10(self.value)
        return v - math.floor((v - lo) / step + 1e-9) * step, math.log10(self.max), step

    def same_value(self, a, b) -> bool:
        """True when ``a`` and ``b`` differ by no more than a browser's rounding of one slider value."""
        if self.options or self.integer:
            return a == b
        if self.log:
            return math.isclose(a, b, rel_tol=1e-9)
        return abs(a - b) <= 1e-9 * max(self.max - self.min, abs(b))


def widgets_available() -> bool:
    """True when ipywidgets imports, an IPython kernel is running, and LABKIT_WIDGETS is not "0". Chapter 1."""
    if os.environ.get("LABKIT_WIDGETS", "1") == "0":
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def _fmt(v, spec: str | None = None) -> str:
    """A number for a table cell or the result line: four significant digits, or ``format(v, spec)``."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return str(v)
    x = float(v)
    if spec:
        return format(x, spec)
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"


class Calculator:
    """A function of named inputs with sliders and a static fallback (see the module docstring).

    Taught in chapter 1; chapters 4 and 5 use the MFU and scaling calculators built on it."""

    def __init__(self, fn: Callable[..., dict], params: list[Param], *, title: str,
                 variations: list[dict] | None = None, formats: dict[str, str] | None = None):
        if not params:
            raise ValueError("a Calculator needs at least one Param")
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate parameter names in {names}")
        self.fn, self.params, self.title = fn, list(params), title
        self.variations = [dict(v) for v in (variations or [])]
        for v in self.variations:
            self._inputs(v)            # validate early: a typo in a variation is an author error
        self.formats = dict(formats or {})
        for k, spec in self.formats.items():
            try:
                format(1.5, spec)
            except (TypeError, ValueError):
                raise ValueError(f"{title}: format for output {k!r} must be a Python format spec such as "
                                 f"',.1f', got {spec!r}") from None

    @property
    def defaults(self) -> dict:
        """The inputs of the table's "defaults" row and of the widget's first result (validated)."""
        return {p.name: p.validate(p.value) for p in self.params}

    def _inputs(self, overrides: dict) -> dict:
        by = {p.name: p for p in self.params}
        bad = sorted(set(overrides) - set(by))
        if bad:
            raise ValueError(f"{self.title}: unknown input(s) {bad}; valid: {sorted(by)}")
        values = self.defaults
        for k, v in overrides.items():
            values[k] = by[k].validate(v)
        return values

    def compute(self, **overrides) -> dict:
        """Outputs at the default inputs changed by ``overrides`` (validated)."""
        out = self.fn(**self._inputs(overrides))
        if not isinstance(out, dict) or not out:
            raise TypeError(f"{self.title}: the calculator function must return a non-empty dict")
        return out

    def formatted(self, out: dict) -> dict:
        """Outputs as shown in the table and on the widget's result line (one formatter for both)."""
        unknown = sorted(set(self.formats) - set(out))
        if unknown:
            raise ValueError(f"{self.title}: formats name output(s) {unknown} that the function does not "
                             f"return; outputs: {list(out)}")
        return {k: _fmt(v, self.formats.get(k)) for k, v in out.items()}

    def text(self, **overrides) -> str:
        values = self._inputs(overrides)
        out = self.formatted(self.compute(**overrides))
        return "; ".join(f"{k} = {v}" for k, v in out.items()) + "   (" + ", ".join(
            f"{p.label} = {_fmt(values[p.name])}" for p in self.params) + ")"

    def table(self, variations: list[dict] | None = None):
        """The static fallback: one row for the defaults and one per variation (inputs that differ + outputs)."""
        import pandas as pd

        rows = []
        for var in [{}] + list(self.variations if variations is None else variations):
            label = "defaults" if not var else ", ".join(f"{k}={_fmt(v)}" for k, v in var.items())
            rows.append({"case": label, **self.compute(**var)})
        return pd.DataFrame(rows).set_index("case")

    def formatted_table(self, variations: list[dict] | None = None):
        """:meth:`table` with every cell as :meth:`formatted` shows it (what ``show`` prints)."""
        t = self.table(variations)
        return t.apply(lambda row: self.formatted(row.to_dict()), axis=1, result_type="expand")

    def _control(self, w, p: Param):
        from traitlets import TraitError

        style, layout = {"description_width": "initial"}, w.Layout(width="480px")
        if p.options:
            return w.Dropdown(options=list(p.options), value=p.value, description=p.label, style=style)
        common = dict(description=p.label, style=style, layout=layout, readout_format=p.readout_format())
        try:
            if p.integer:
                return w.IntSlider(value=int(p.value), min=int(p.min), max=int(p.max), step=p.slider_step(),
                                   **common)
            if p.log:
                lo, hi, step = p.log_grid()
                return w.FloatLogSlider(value=p.value, min=lo, max=hi, step=step, **common)
            return w.FloatSlider(value=p.value, min=p.min, max=p.max, step=p.slider_step(), **common)
        except TraitError:
            raise ValueError(f"Param {p.name}: readout {p.readout_format()!r} is not a number format that "
                             f"ipywidgets accepts (d3-format without '~', e.g. '.4', '.2f', 'd')") from None

    def widget(self):
        """The ipywidgets UI (sliders + a live result line). Raises ImportError without ipywidgets.

        The box carries ``controls`` (name -> slider), ``result`` (the HTML line), ``inputs`` (the exact
        inputs of the last result), ``outputs`` (its values) and ``shown`` (its text, as in the table)."""
        import ipywidgets as w

        by = {p.name: p for p in self.params}
        controls = {p.name: self._control(w, p) for p in self.params}
        inputs = self.defaults
        result = w.HTML()
        box = w.VBox([w.HTML(f"<b>{self.title}</b>"), *controls.values(), result])
        box.controls, box.result, box.inputs = controls, result, inputs   # for tests and for learners

        def update(change=None):
            if change is not None:
                p = by[next(k for k, c in controls.items() if c is change["owner"])]
                new = change["new"] if p.options else min(max(change["new"], p.min), p.max)  # 10**log10(max)
                if not p.same_value(new, inputs[p.name]):
                    inputs[p.name] = new           # a real move; a browser's echo keeps the exact value
            try:
                box.outputs = self.compute(**inputs)
                box.shown = self.formatted(box.outputs)
                result.value = "<br>".join(f"<b>{k}</b>: {v}" for k, v in box.shown.items())
            except (ValueError, TypeError) as e:
                box.outputs, box.shown = {}, {}
                result.value = f"<span style='color:#C44E52'>{e}</span>"

        for c in controls.values():
            c.observe(update, names="value")
        update()
        return box

    def static_html(self) -> str:
        """The widget as HTML at its defaults — title, every input, the result line — for a page whose widget
        front end is not running yet (what a stored notebook shows before its kernel runs)."""
        from html import escape

        values, shown = self.defaults, self.formatted(self.compute())
        rows = "".join(f"<tr><td style='text-align:left'>{escape(p.label)}</td><td style='text-align:right'>"
                       f"{escape(_fmt(values[p.name]))}</td></tr>" for p in self.params)
        result = "<br>".join(f"<b>{escape(k)}</b>: {escape(v)}" for k, v in shown.items())
        return (f"<div><b>{escape(self.title)}</b> <i>(at its defaults: the sliders appear when this cell "
                f"runs)</i><table>{rows}</table>{result}</div>")

    def show(self, mode: str = "auto") -> str:
        """Display sliders (when widgets can run) and the static table; returns the mode used.

        ``mode``: "auto" (widgets when available), "widget" (force; errors without ipywidgets) or "static".
        The widget's output also carries :meth:`static_html` (and :meth:`text` as its plain text), which a
        page shows while no widget front end runs; the table is displayed as HTML and as text.
        """
        if mode not in ("auto", "widget", "static"):
            raise ValueError(f"mode must be 'auto', 'widget' or 'static', got {mode!r}")
        used = "static"
        if mode == "widget" or (mode == "auto" and widgets_available()):
            from IPython.display import display

            bundle = dict(self.widget()._repr_mimebundle_())
            bundle.update({"text/plain": self.text(), "text/html": self.static_html()})
            display(bundle, raw=True)
            used = "widget"
        print(f"{self.title} — static table (the same maths as the sliders):")
        t = self.formatted_table()
        if _in_ipython():          # HTML wraps inside its cells; the text stays whole for a text-only viewer
            from IPython.display import display

            display({"text/html": t.to_html(), "text/plain": t.to_string()}, raw=True)
        else:
            print(t.to_string())
        return used


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


# --------------------------------------------------------------------------- chapter calculators
def cost_calculator(*, n_params_b: float = 8.0, tokens_b: float = 1000.0, n_devices: int = 512,
                    peak_tflops: float = 989.0, mfu: float = 0.4, price_per_device_hour: float = 2.0,
                    throughput_drop: float = 0.3) -> Calculator:
    """GPU-hours / cost / wall-clock of a run, and what a throughput drop adds (chapter 1).

    FLOPs per token = 6·N (Kaplan et al. 2020, §2.1); tokens/s from MFU (``labkit.perf.cost``).
    Defaults are inputs, not results: pass the case you study (e.g. a catalogue peak from labkit.hardware).
    """
    from labkit.perf import cost

    def fn(n_params_b, tokens_b, n_devices, peak_tflops, mfu, price_per_device_hour, throughput_drop):
        c = cost.training_cost(tokens=tokens_b * 1e9, flops_per_token=6 * n_params_b * 1e9,
                               n_devices=int(n_devices), peak_flops=peak_tflops * 1e12, mfu=mfu,
                               price_per_device_hour=price_per_device_hour)
        extra = cost.extra_wallclock_fraction(throughput_drop)
        return {"tokens/s (global)": c.tokens_per_s, "wall-clock days": c.days,
                "device-hours": c.device_hours, "cost": c.cost,
                "extra wall-clock from the drop": f"{extra:.1%}",
                "extra cost from the drop": c.cost * extra}

    params = [
        Param("n_params_b", "parameters (billions)", n_params_b, 0.1, 1000.0, log=True),
        Param("tokens_b", "training tokens (billions)", tokens_b, 1.0, 100000.0, log=True),
        Param("n_devices", "devices", n_devices, 1, 65536, integer=True, step=1),
        Param("peak_tflops", "peak TFLOP/s per device", peak_tflops, 0.01, 5000.0, log=True),
        Param("mfu", "MFU", mfu, 0.01, 1.0, step=0.01),
        Param("price_per_device_hour", "price per device-hour", price_per_device_hour, 0.0, 20.0, step=0.1),
        Param("throughput_drop", "throughput drop", throughput_drop, 0.0, 0.9, step=0.01),
    ]
    variations = [{"mfu": round(mfu * (1 - throughput_drop), 6)}, {"n_devices": max(1, n_devices // 2)}]
    return Calculator(fn, params, title="Training cost calculator", variations=variations,
                      formats={"wall-clock days": ",.1f"})


def mfu_calculator(*, tokens_per_s: float = 3000.0, flops_per_token: float = 6 * 8e9, n_devices: int = 1,
                   peak_tflops: float = 989.0, recompute_factor: float = 4 / 3) -> Calculator:
    """MFU and HFU from throughput (chapter 4).

    MFU = tokens/s × model FLOPs per token / (devices × peak); HFU counts the FLOPs the hardware ran,
    here model FLOPs × ``recompute_factor`` (4/3 for full recomputation: 8PD/6PD) —
    PaLM (Chowdhery et al. 2022, App. B). Uses ``labkit.flops.mfu``.
    """
    from labkit.flops import mfu as m

    def fn(tokens_per_s, flops_per_token, n_devices, peak_tflops, recompute_factor):
        peak = peak_tflops * 1e12
        achieved = tokens_per_s * flops_per_token
        cap = n_devices * peak
        out = {"model FLOP/s": achieved}
        if achieved > cap:
            out["MFU"] = f"impossible: {achieved / cap:.2f}× peak — check tokens/s or peak"
            return out
        out["MFU"] = m.mfu(tokens_per_s=tokens_per_s, flops_per_token=flops_per_token, n_devices=int(n_devices),
                           peak_flops=peak)
        hw = flops_per_token * recompute_factor
        out["HFU"] = (m.hfu(tokens_per_s=tokens_per_s, hardware_flops_per_token=hw, n_devices=int(n_devices),
                            peak_flops=peak) if achieved * recompute_factor <= cap else "above peak")
        return out

    params = [
        Param("tokens_per_s", "tokens/s (global)", tokens_per_s, 1e-3, 1e9, log=True),
        Param("flops_per_token", "model FLOPs per token", flops_per_token, 1e3, 1e16, log=True),
        Param("n_devices", "devices", n_devices, 1, 65536, integer=True),
        Param("peak_tflops", "peak TFLOP/s per device", peak_tflops, 1e-3, 5000.0, log=True),
        Param("recompute_factor", "hardware/model FLOPs (recompute)", recompute_factor, 1.0, 2.0, step=0.01),
    ]
    variations = [{"tokens_per_s": tokens_per_s / 2}, {"recompute_factor": 1.0}]
    return Calculator(fn, params, title="MFU / HFU calculator", variations=variations)


def scaling_calculator(*, t1_ms: float | None = None, n: int | None = None, comm_ms: float | None = None,
                       sync_ms: float | None = None) -> Calculator:
    """Step time and speedup with and without overlap (chapter 5), via ``labkit.measure.scaling``.

    An input left as None starts at the BERT-large seed case (:func:`labkit.teaching.cases.bert_large`: the
    source's 360 ms on one GPU; 4 GPUs, all-reduce 120 ms, sync 15 ms).
    """
    from labkit.measure import scaling as s
    from labkit.teaching.cases import bert_large

    case = bert_large()
    t1_ms = case.t1_ms if t1_ms is None else t1_ms
    n = case.n if n is None else n
    comm_ms = case.comm_ms if comm_ms is None else comm_ms
    sync_ms = case.sync_ms if sync_ms is None else sync_ms

    def fn(t1_ms, n, comm_ms, sync_ms):
        compute = t1_ms / n
        over = s.step_time(compute, comm_ms, sync_ms, overlap=True)
        serial = s.step_time(compute, comm_ms, sync_ms, overlap=False)
        return {"compute per device (ms)": compute, "step, overlap (ms)": over,
                "step, no overlap (ms)": serial, "speedup, overlap": t1_ms / over,
                "speedup, no overlap": t1_ms / serial, "efficiency, no overlap": t1_ms / serial / n}

    params = [
        Param("t1_ms", "1-device step (ms)", t1_ms, 1.0, 10000.0, log=True),
        Param("n", "devices", n, 1, 1024, integer=True),
        Param("comm_ms", "gradient all-reduce (ms)", comm_ms, 0.0, 5000.0, step=1.0),
        Param("sync_ms", "serial remainder (ms)", sync_ms, 0.0, 5000.0, step=1.0),
    ]
    return Calculator(fn, params, title="Scaling calculator", variations=[{"n": max(1, n * 2)}, {"comm_ms": 0.0}])
