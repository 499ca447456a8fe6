"""labkit.teaching.viz: SI formatting and that each helper draws on a headless backend."""
import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from labkit.measure import scaling
from labkit.teaching import viz  # noqa: E402


def test_si():
    assert viz.si(3.2e14, "FLOP/s") == "320 TFLOP/s"
    assert viz.si(25.6e9, "B/s") == "25.6 GB/s"
    assert viz.si(0.0012, "s") == "1.2 ms"
    assert viz.si(0, "s") == "0 s"


def test_helpers_draw():
    fig, axes = viz.new_axes(2)
    pts = pd.DataFrame({"m": [1, 512], "n": [512, 512], "k": [512, 512], "intensity": [0.5, 85.0],
                        "FLOP/s": [1e9, 1e11], "bound": ["memory", "compute"]})
    ax = viz.roofline(1e11, 1e10, pts, ax=axes[0])
    assert len(ax.lines) >= 2 and ax.get_xscale() == "log"
    ax = viz.stacked_parts({"a": {"compute": 0.09, "comm": 0.065}}, ax=axes[1])
    assert len(ax.patches) == 2
    ax = viz.scaling(scaling.scaling_table({1: 1.0, 2: 1.5}))
    assert ax.get_xlabel() == "devices"
    ax = viz.bars({"x": 1.0, "y": 2.0})
    assert len(ax.patches) == 2


def test_tuning_figures_draw_from_labkit_results():
    """Chapters 20, 21, 29: each picture is drawn from the figures labkit computes for the chapter."""
    import pytest

    from labkit import memory
    from labkit.memory import recompute
    from labkit.model.gpt import gpt_config
    from labkit.teaching import cases

    stages = {k: memory.model_state_bytes(7.5e9, strategy=s, n_ranks=64) for k, s in
              (("DDP", "ddp"), ("ZeRO-1", "zero1"), ("ZeRO-2", "zero2"), ("ZeRO-3", "zero3"))}
    live = pd.DataFrame({"params peak fwd MB": [3.1, 3.7], "predicted peak MB": [3.1, 3.7],
                         "params after fwd MB": [0.9, 3.7], "predicted after MB": [0.9, 3.7],
                         "model states MB": [3.7, 3.7]}, index=["True", "False"])
    left, right = viz.zero_stages(stages, live, n_ranks=64)
    tops = [sum(p.get_height() for p in left.patches if abs(p.get_x() + p.get_width() / 2 - i) < 1e-9)
            for i in range(4)]
    assert tops == pytest.approx([120, 31.41, 16.64, 1.875], rel=1e-3)       # ZeRO Figure 1, GB per rank
    assert len(right.patches) == 4 and len(viz.zero_stages(stages)) == 1
    with pytest.raises(ValueError, match="stages is empty"):
        viz.zero_stages({})

    budget = 9 * 2**30
    costs = recompute.policy_costs(gpt_config("1b"), 8, attention="sdpa", dtype_bytes=2, budget_bytes=budget)
    (ax,) = viz.recompute_tradeoff(costs, budget_bytes=budget)
    ringed = [ln for ln in ax.lines if ln.get_label() == "cheapest that fits"]
    pick = costs[costs["fits"]].sort_values("extra_flops").iloc[0]
    assert ringed and ringed[0].get_xdata()[0] == pytest.approx(pick["extra_flops"] * 100)

    t13 = cases.thirteen_b()
    thr, eff = viz.scaling_case(t13, t13.modelled())
    heights = sorted(round(p.get_height()) for p in eff.patches)
    assert 58 in heights and 92 in heights             # the source's 58 % -> 92 %, coherent reading
    measured = next(ln for ln in thr.lines if ln.get_label() == "source, measured")
    assert list(measured.get_ydata()) == pytest.approx([1.8 * 64, 1.05 * 128])
