"""The straggler verdict: last most often AND late by a margin of the step (labkit.trace.stragglers).

A healthy 2-rank run on a loaded CPU puts one rank last at every collective by a few ms (a time slice):
that is not a straggler. An injected straggler is late by a large share of its step and is caught.
"""
from __future__ import annotations

import pytest

from labkit.trace.stragglers import LATE_MARGIN, stragglers

STEP_US, N_STEPS, PER_STEP = 100_000.0, 3, 2       # 100 ms steps, two all-reduces (DDP buckets) per step


class _View:
    """What stragglers() reads of a rank: its kind and the compute between two instants."""

    def __init__(self, kind):
        self.kind = kind

    def compute_between(self, t0, t1):
        return max(0.0, t1 - t0)


def _colls(late_us: float, kind: str = "cpu"):
    """Rank 1 arrives ``late_us`` after rank 0 at every collective of 3 steps of 100 ms."""
    out = {}
    for rank in (0, 1):
        wins = [(s, s * STEP_US, (s + 1) * STEP_US, s * STEP_US, (s + 1) * STEP_US) for s in range(N_STEPS)]
        colls = [{"start_us": s * STEP_US + 40_000.0 + 20_000.0 * k + (late_us if rank else 0.0),
                  "dur_us": 8_000.0, "type": "all_reduce"} for s in range(N_STEPS) for k in range(PER_STEP)]
        out[rank] = (_View(kind), wins, colls)
    return out


def test_healthy_but_last_on_a_loaded_cpu_is_not_a_straggler():
    """Last at 6/6 (binomial p = 1.6 %) by 8 ms of a 100 ms step — what a loaded 2-core machine does."""
    table, aligned = stragglers(_colls(8_000.0))
    r1 = table.set_index("rank").loc[1]
    assert int(r1["times_last"]) == 6 and r1["late_of_step"] == pytest.approx(0.08)
    assert not table["straggler"].any()
    assert list(aligned["last_rank"]) == [1] * 6


def test_a_rank_late_by_a_third_of_its_step_is_a_straggler():
    table, _ = stragglers(_colls(35_000.0))                  # an injected stall: 35 % of the step
    assert table.set_index("rank")["straggler"].to_dict() == {0: False, 1: True}


def test_the_margin_is_relative_to_the_step_and_to_the_kind_of_trace():
    # the same 8 % of a step on GPU ranks (each owns its device) is a slow rank
    gpu, _ = stragglers(_colls(8_000.0, kind="gpu"))
    assert gpu.set_index("rank")["straggler"].to_dict() == {0: False, 1: True}
    assert LATE_MARGIN["gpu"] < 0.08 < LATE_MARGIN["cpu"] < 0.35
    # just under / over the CPU margin
    under, _ = stragglers(_colls(STEP_US * LATE_MARGIN["cpu"] * 0.9))
    over, _ = stragglers(_colls(STEP_US * LATE_MARGIN["cpu"] * 1.1))
    assert not under["straggler"].any() and over.set_index("rank").loc[1, "straggler"]


def test_last_beyond_chance_at_the_level_chapter_9_teaches():
    """With 2 ranks 4 of 4 and 5 of 6 are last beyond chance (tails 1/16, 7/64), 3 of 3 (1/8) and 4 of 6 are not;
    with 4 ranks 2 of 3 is not (10/64) and 5 of 8 is (0.027)."""
    from labkit.trace.stragglers import CHANCE_LEVEL, binom_tail, last_beyond_chance

    assert binom_tail(6, 5, 0.5) == pytest.approx(7 / 64) and CHANCE_LEVEL == 0.125
    assert [last_beyond_chance(n, k, 2) for n, k in ((4, 4), (6, 5), (3, 3), (6, 4), (2, 2))] == [
        True, True, False, False, False]
    assert not last_beyond_chance(3, 2, 4) and last_beyond_chance(8, 5, 4)


def test_a_straggler_last_at_five_of_six_is_named():
    """One collective of six where a time slice put the other rank last does not hide a rank late by a third."""
    colls = _colls(35_000.0)
    colls[0][2][3]["start_us"] += 40_000.0            # rank 0 held 40 ms at one collective: 5 ms after rank 1
    table, _ = stragglers(colls)
    r1 = table.set_index("rank").loc[1]
    assert int(r1["times_last"]) == 5 and bool(r1["straggler"])
