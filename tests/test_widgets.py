"""labkit.teaching.widgets: calculators build headless, compute the same maths, and fall back to a table."""
import math

import pytest

from labkit.measure import scaling
from labkit.perf import cost
from labkit.teaching import widgets


def test_cost_calculator_matches_labkit_cost():
    calc = widgets.cost_calculator(n_params_b=8, tokens_b=1000, n_devices=512, peak_tflops=989, mfu=0.4)
    out = calc.compute()
    ref = cost.training_cost(tokens=1e12, flops_per_token=48e9, n_devices=512, peak_flops=989e12, mfu=0.4,
                             price_per_device_hour=2.0)
    assert out["device-hours"] == pytest.approx(ref.device_hours)
    assert out["extra wall-clock from the drop"] == "42.9%"
    t = calc.table()
    assert list(t.index)[0] == "defaults" and len(t) == 3
    assert t["device-hours"].iloc[1] == pytest.approx(ref.device_hours / 0.7)


def test_widget_builds_headless_and_updates():
    pytest.importorskip("ipywidgets")
    calc = widgets.scaling_calculator()         # starts on the BERT-large case (labkit.teaching.cases)
    box = calc.widget()
    assert "135" in box.result.value            # max(90, 120) + 15
    box.controls["comm_ms"].value = 0.0
    assert "3.429" in box.result.value          # no comm: 360 / (90 + 15)


def test_scaling_calculator_defaults_are_the_bert_large_case():
    from labkit.teaching.cases import bert_large

    case, out = bert_large(), widgets.scaling_calculator().compute()
    assert out["step, overlap (ms)"] == pytest.approx(case.step_ms(True))
    assert out["step, no overlap (ms)"] == pytest.approx(case.step_ms(False))
    assert out["speedup, overlap"] == pytest.approx(case.speedup(True))
    assert widgets.scaling_calculator(comm_ms=0.0).compute()["step, overlap (ms)"] == pytest.approx(105)


def test_show_static_fallback(capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_WIDGETS", "0")
    assert widgets.widgets_available() is False
    used = widgets.scaling_calculator().show()
    assert used == "static"
    out = capsys.readouterr().out
    assert "static table" in out and "defaults" in out
    with pytest.raises(ValueError, match="mode"):
        widgets.scaling_calculator().show(mode="fancy")


def test_mfu_calculator_flags_impossible_inputs():
    pytest.importorskip("labkit.flops.mfu")
    calc = widgets.mfu_calculator(tokens_per_s=1000, flops_per_token=6e9, n_devices=1, peak_tflops=100)
    out = calc.compute()
    assert out["MFU"] == pytest.approx(0.06)
    assert out["HFU"] == pytest.approx(0.08)
    assert "impossible" in calc.compute(tokens_per_s=1e6)["MFU"]


def test_bad_inputs_are_named():
    calc = widgets.scaling_calculator()
    with pytest.raises(ValueError, match="unknown input"):
        calc.compute(nope=1)
    with pytest.raises(ValueError, match="n must be in"):
        calc.compute(n=0)
    with pytest.raises(ValueError, match="outside"):
        widgets.Param("x", "x", 5, 0, 1)
    with pytest.raises(ValueError, match="duplicate"):
        widgets.Calculator(lambda x: {"y": x}, [widgets.Param("x", "x", 0.5), widgets.Param("x", "x", 0.5)],
                           title="t")
    c = widgets.Calculator(lambda x: {"y": scaling.speedup(1, x)}, [widgets.Param("x", "x", 0.5)], title="t")
    assert c.compute(x=0.25)["y"] == 4
    assert "y = 2" in c.text()


# ---------------------------------------------------------------- the widget starts on the table's defaults row
# Inputs as the chapters pass them: measured and catalogue values that lie between slider steps.
CHAPTER_CASES = {
    "ch01 cost": lambda: widgets.cost_calculator(n_params_b=403.752042496, tokens_b=15600, n_devices=16384,
                                                 peak_tflops=989.5, mfu=0.40, price_per_device_hour=2.49,
                                                 throughput_drop=0.30),
    "ch04 mfu": lambda: widgets.mfu_calculator(tokens_per_s=6761.283841315374, flops_per_token=5.7231e6,
                                               n_devices=1, peak_tflops=0.11423, recompute_factor=1.1523),
    "ch05 scaling": lambda: widgets.scaling_calculator(),          # the chapter starts on labkit.teaching.cases' numbers
    "ch05 scaling, off-grid": lambda: widgets.scaling_calculator(t1_ms=360, n=4, comm_ms=64.87, sync_ms=45.31),
}


def _browser_echo(c) -> float:
    """The value a browser sends back when it draws slider ``c`` (ipywidgets 8 + noUiSlider 15): the start
    position (``ln v / ln base`` for a log slider) to a percentage of the range, snapped to the step grid
    from ``min`` when there is a step, and back."""
    log = hasattr(c, "base")
    x = min(max(math.log(c.value) / math.log(c.base), c.min), c.max) if log else c.value
    span = c.max - c.min
    pct = (x - c.min) * 100 / span
    if c.step is not None:
        grid = c.step * 100 / span
        pct = round(pct / grid) * grid
    x = pct * span / 100 + c.min
    return c.base ** x if log else round(x) if isinstance(c.value, int) else x   # IntSlider: Math.round


def _row(calc, which="defaults", **overrides):
    raw = calc.table([overrides] if overrides else []).loc[which].to_dict()
    shown = calc.formatted_table([overrides] if overrides else []).loc[which].to_dict()
    return raw, shown


@pytest.mark.parametrize("case", sorted(CHAPTER_CASES))
def test_widget_first_result_is_the_tables_defaults_row(case):
    pytest.importorskip("ipywidgets")
    calc = CHAPTER_CASES[case]()
    box = calc.widget()
    raw, shown = _row(calc)
    assert box.outputs == raw                        # the same numbers, not approximately
    assert box.shown == shown                        # and the same text as the printed table
    assert all(f"<b>{k}</b>: {v}<" in box.result.value + "<" for k, v in shown.items())
    for c in box.controls.values():                  # the browser draws the sliders and sends values back
        c.value = _browser_echo(c)
    assert box.outputs == raw and box.shown == shown
    assert box.inputs == calc.defaults


@pytest.mark.parametrize("case, name, value", [("ch01 cost", "peak_tflops", 500.0), ("ch01 cost", "mfu", 0.55),
                                               ("ch04 mfu", "tokens_per_s", 3000.0),
                                               ("ch04 mfu", "recompute_factor", 1.0),
                                               ("ch05 scaling", "n", 8), ("ch05 scaling", "comm_ms", 10.0)])
def test_moving_a_slider_recomputes_with_the_table_maths(case, name, value):
    pytest.importorskip("ipywidgets")
    calc = CHAPTER_CASES[case]()
    box = calc.widget()
    first = dict(box.outputs)
    box.controls[name].value = value
    raw, shown = _row(calc, f"{name}={widgets._fmt(value)}", **{name: value})
    assert box.outputs == raw == calc.compute(**{name: value}) and box.outputs != first
    assert box.shown == shown and box.inputs[name] == value


def test_sliders_start_on_their_value_and_read_out_sensibly():
    pytest.importorskip("ipywidgets")
    box = CHAPTER_CASES["ch01 cost"]().widget()
    peak, mfu, devices = box.controls["peak_tflops"], box.controls["mfu"], box.controls["n_devices"]
    assert peak.step == 0.01 and peak.value == pytest.approx(989.5, rel=1e-12)   # a log grid through 989.5
    assert _browser_echo(peak) == pytest.approx(989.5, rel=1e-12)
    assert peak.readout_format == ".4" and format(989.5, ".4g") == "989.5"       # d3 ".4": 989.5, not 1.00e+3
    assert mfu.step == 0.01 and _browser_echo(mfu) == pytest.approx(0.4, abs=1e-12)  # on the grid: stepped
    assert devices.readout_format == "d" and devices.step == 1
    assert box.controls["price_per_device_hour"].step is None                   # 2.49 is between 0.1 steps
    wide = CHAPTER_CASES["ch04 mfu"]().widget().controls["flops_per_token"]
    assert wide.readout_format == ".5"                                            # 5.7231e+6, editable
    assert box.shown["wall-clock days"] == f"{box.outputs['wall-clock days']:,.1f}"


def test_a_browser_rounding_at_the_end_of_a_log_slider_is_not_an_error():
    pytest.importorskip("ipywidgets")
    calc = widgets.cost_calculator()
    box = calc.widget()
    box.controls["peak_tflops"].value = 10 ** math.log10(5000.0)     # 5000.000000000001 from the browser
    assert "color:#C44E52" not in box.result.value
    assert box.outputs == calc.compute(peak_tflops=5000.0)


def test_formats_and_readouts_are_checked():
    with pytest.raises(ValueError, match="format for output 'y'.*'%q'"):
        widgets.Calculator(lambda x: {"y": x}, [widgets.Param("x", "x", 0.5)], title="t", formats={"y": "%q"})
    c = widgets.Calculator(lambda x: {"y": x}, [widgets.Param("x", "x", 0.5)], title="t", formats={"z": ".1f"})
    with pytest.raises(ValueError, match=r"formats name output\(s\) \['z'\]"):
        c.text()
    with pytest.raises(ValueError, match="readout must be"):
        widgets.Param("x", "x", 0.5, readout="")
    assert widgets.Param("x", "x", 0.5, readout=".2f").readout_format() == ".2f"
    with pytest.raises(ValueError, match="step must be a finite number > 0, got -1"):
        widgets.Param("x", "x", 0.5, step=-1)
    pytest.importorskip("ipywidgets")
    bad = widgets.Calculator(lambda x: {"y": x}, [widgets.Param("x", "x", 0.5, readout=".3~g")], title="t")
    with pytest.raises(ValueError, match=r"Param x: readout '\.3~g' is not a number format"):
        bad.widget()


def _key_presses_to_min(c) -> int:
    """Left-arrow presses a browser needs to take slider ``c`` from its value to its minimum (noUiSlider
    moves the handle by ``step``; with no step, by 10 % of the range)."""
    log = hasattr(c, "base")
    x = math.log(c.value) / math.log(c.base) if log else c.value
    step = c.step if c.step is not None else (c.max - c.min) / 10
    return math.ceil((x - c.min) / step - 1e-9)


@pytest.mark.parametrize("case", sorted(CHAPTER_CASES))
def test_log_sliders_have_a_keyboard_step_of_a_few_percent(case):
    """Issue #27: an off-grid log slider had no step, so each arrow key moved it by 10 % of its range —
    from tokens/s = 2,209 to the minimum in 8 presses. Now every log slider steps by 0.01 decade (×1.023)."""
    pytest.importorskip("ipywidgets")
    calc = CHAPTER_CASES[case]()
    box = calc.widget()
    for p in calc.params:
        if not p.log:
            continue
        c = box.controls[p.name]
        assert c.step == 0.01 and 10 ** c.step - 1 < 0.025
        assert p.min <= c.base ** c.min < p.min * 10 ** c.step and c.max == pytest.approx(math.log10(p.max))
        assert _browser_echo(c) == pytest.approx(p.value, rel=1e-12)       # the grid passes through the value
        assert _key_presses_to_min(c) >= 100 * (math.log10(p.value / p.min) - 0.01)


def test_the_issue_case_takes_hundreds_of_presses_not_eight():
    pytest.importorskip("ipywidgets")
    box = widgets.mfu_calculator(tokens_per_s=2209.0, flops_per_token=5.7e6, n_devices=1, peak_tflops=0.17).widget()
    c = box.controls["tokens_per_s"]
    assert _key_presses_to_min(c) == 634                    # log10(2209 / 1e-3) = 6.34 decades / 0.01
    c.value = c.base ** (math.log10(2209.0) - c.step)      # one left-arrow press
    assert box.inputs["tokens_per_s"] == pytest.approx(2209.0 / 10 ** 0.01, rel=1e-9)


def test_show_stores_a_static_rendering_with_the_widget(monkeypatch):
    """Issue #27: before the kernel runs, JupyterLab has no widget renderer and showed the widget's text/plain
    (`VBox(children=(HTML(...`). The widget output now carries a static HTML rendering and readable text."""
    pytest.importorskip("ipywidgets")
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    monkeypatch.setattr(widgets, "_in_ipython", lambda: True)
    calc = CHAPTER_CASES["ch04 mfu"]()
    assert calc.show(mode="widget") == "widget"
    (bundle, raw), (table, raw_t) = shown
    assert raw and raw_t
    assert "application/vnd.jupyter.widget-view+json" in bundle and "VBox" not in bundle["text/plain"]
    assert bundle["text/plain"] == calc.text()
    html = bundle["text/html"]
    assert "MFU / HFU calculator" in html and all(p.label in html for p in calc.params)
    assert all(f"<b>{k}</b>: {v}" in html for k, v in calc.formatted(calc.compute()).items())
    assert "<table" in table["text/html"] and table["text/plain"] == calc.formatted_table().to_string()
