"""labkit.trace.timeline on the shipped recorded DDP trace, and viz.ddp_timeline drawn from it."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import labkit  # noqa: E402
from labkit import trace
from labkit.teaching import viz  # noqa: E402

DDP = labkit.paths.dataset("traces", "cpu_gloo_ddp_tiny")


@pytest.fixture(scope="module", params=[0, 1])
def tl(request):
    return trace.ddp_timeline(DDP, rank=request.param)


def test_each_bucket_is_launched_inside_backward_in_order(tl):
    b0, b1 = tl.backward_span
    assert len(tl.buckets) == 2 and list(tl.buckets["bucket"]) == [0, 1]
    assert (tl.buckets["launch_ms"] >= b0).all() and (tl.buckets["launch_ms"] <= b1).all()
    assert tl.buckets["launch_ms"].is_monotonic_increasing
    assert (tl.buckets["start_ms"] >= tl.buckets["launch_ms"]).all()     # runs after its launch
    assert tl.forward[1] <= b0 and tl.optimizer[0] >= b1


def test_backward_computes_the_next_bucket_after_the_first_launch(tl):
    first, second = tl.buckets["launch_ms"]
    assert tl.compute_between(first, second) > 0
    assert tl.buckets.loc[0, "hidden_ms"] <= tl.buckets.loc[0, "end_ms"] - tl.buckets.loc[0, "start_ms"] + 1e-9


def test_bad_rank_and_step_are_named():
    with pytest.raises(ValueError, match="ranks \\[0, 1\\]"):
        trace.ddp_timeline(DDP, rank=5)
    with pytest.raises(ValueError, match="steps in the trace"):
        trace.ddp_timeline(DDP, step=999)


def test_viz_draws_one_bar_per_bucket_from_the_timeline(tl):
    ax = viz.ddp_timeline(tl)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [lab for lab in labels if lab.endswith("all-reduce")] == [f"bucket {k} all-reduce" for k in tl.buckets["bucket"]]
    assert [t.get_text() for t in ax.texts] == [f"b{k}" for k in tl.buckets["bucket"]]
    bars = [c for c in ax.collections if c.get_label().startswith("bucket")]
    assert [c.get_paths()[0].get_extents().x0 for c in bars] == pytest.approx(list(tl.buckets["start_ms"]))
    import matplotlib.pyplot as plt

    plt.close(ax.figure)
