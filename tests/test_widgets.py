"""labkit.widgets: calculators build headless, compute the same maths, and fall back to a table."""
import pytest

from labkit import cost, scaling, widgets


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
    calc = widgets.scaling_calculator()
    box = calc.widget()
    assert "135" in box.result.value
    box.controls["comm_ms"].value = 0.0
    assert "2.667" in box.result.value          # no comm: 360 / (90 + 45)


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
    pytest.importorskip("labkit.mfu")
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
