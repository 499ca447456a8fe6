"""labkit.comm.ring: the naive ring all-reduce on real gloo ranks, its log, and the figure drawn from it."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from labkit import comm
from labkit.comm import ring  # noqa: E402
from labkit.teaching import viz  # noqa: E402


@pytest.fixture(scope="module", params=[2, 4])
def demo(request):
    return comm.run_ring(request.param, timeout_s=120)


def test_ring_equals_all_reduce(demo):
    assert demo.matches and demo.max_abs_diff == 0.0


def test_log_has_2n_minus_2_steps_with_the_ring_schedule(demo):
    n, log = demo.nprocs, demo.log
    assert sorted(log["step"].unique()) == list(range(2 * (n - 1)))
    assert len(log) == 2 * (n - 1) * n                       # every rank acts at every step
    for row in log.to_dict("records"):
        r, step = row["rank"], row["step"]
        if step < n - 1:
            assert row["phase"] == "reduce-scatter" and row["send_chunk"] == (r - step) % n
        else:
            assert row["phase"] == "all-gather" and row["send_chunk"] == (r + 1 - (step - n + 1)) % n
        assert row["to"] == (r + 1) % n and row["from"] == (r - 1) % n
    # what a rank receives is what its left neighbour sent in the same step
    by = log.set_index(["step", "rank"])
    for (step, r), row in by.iterrows():
        assert row["recv_chunk"] == by.loc[(step, (r - 1) % n), "send_chunk"]


def test_reduce_scatter_leaves_rank_r_with_chunk_r_plus_1_summed(demo):
    n, log = demo.nprocs, demo.log
    last_rs = log[log["step"] == n - 2]
    for row in last_rs.to_dict("records"):
        assert row["recv_chunk"] == (row["rank"] + 1) % n
        assert row["holds"] == tuple(range(n))
    first = log[log["step"] == 0]
    assert all(len(h) == 2 for h in first["holds"])      # one neighbour's input added to one's own


def test_bytes_sent_per_rank_is_2_n_minus_1_over_n_of_the_buffer(demo):
    n = demo.nprocs
    assert (demo.sent_per_rank == 2 * (n - 1) * demo.size_bytes // n).all()


def test_viz_draws_one_cell_per_step_and_rank_from_the_log(demo):
    ax = viz.ring_allreduce(demo.log)
    n = demo.nprocs
    assert len(ax.patches) == len(demo.log) == 2 * (n - 1) * n
    texts = [t.get_text() for t in ax.texts]
    first = demo.log.iloc[0]
    assert f"chunk {first['recv_chunk']} ← r{first['from']}" in texts[0]
    assert sum("Σ r" + "+".join(map(str, range(n))) in t for t in texts) >= n * n   # all-gather rows: full sums
    import matplotlib.pyplot as plt

    plt.close(ax.figure)


def test_viz_refuses_a_table_that_is_not_a_ring_log():
    import pandas as pd

    with pytest.raises(ValueError, match="run_ring"):
        viz.ring_allreduce(pd.DataFrame({"step": [0], "rank": [0]}))


def test_contributors_decodes_powers_of_two_and_refuses_others():
    assert ring.contributors(5.0, 3) == (0, 2)
    assert ring.contributors(15.0, 4) == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="2\\*\\*r"):
        ring.contributors(2.5, 4)
    with pytest.raises(ValueError):
        ring.contributors(16.0, 4)


def test_run_ring_checks_its_arguments():
    with pytest.raises(ValueError):
        comm.run_ring(1)
    with pytest.raises(ValueError, match="52"):
        comm.run_ring(53)
