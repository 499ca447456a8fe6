"""labkit.viz: SI formatting and that each helper draws on a headless backend."""
import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from labkit import scaling, viz  # noqa: E402


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
