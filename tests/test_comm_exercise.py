"""labkit.comm.exercise: lab 9's SYNTHETIC clusters have one clear limiting link, their tables say it, and the
held-out tolerance follows the run's noise within its bounds."""
from __future__ import annotations

import numpy as np
import pytest

from labkit import comm
from labkit.comm import exercise


def _busbw(text: str) -> tuple[float, int]:
    nt = comm.parse_nccl_tests(text)
    last = nt.rows.sort_values("size").iloc[-1]
    return last["size"] / (last["oop_time_us"] * 1e-6) * comm.bus_factor("all_reduce", nt.nranks), nt.nranks


def test_pcie_bandwidth_is_the_spec_arithmetic():
    assert exercise.pcie_bw(4, 16) == pytest.approx(31.5e9, rel=1e-3)       # 16 GT/s x 16 x 128/130 / 8
    assert exercise.pcie_bw(5, 16) == pytest.approx(2 * exercise.pcie_bw(4, 16))
    assert exercise.pcie_bw(3, 8) == pytest.approx(7.88e9, rel=1e-3)
    with pytest.raises(ValueError, match="gen"):
        exercise.pcie_bw(6, 16)
    with pytest.raises(ValueError, match="lanes"):
        exercise.pcie_bw(4, 3)


@pytest.mark.parametrize("name", list(exercise.CLUSTERS))
def test_every_cluster_has_one_clear_bottleneck_on_its_path(name):
    cl = exercise.CLUSTERS[name]
    c = cl.ceilings()
    on = sorted(cl.on_path(), key=c.get)
    assert on[0] == _limiting(cl)
    if len(on) > 1:
        assert c[on[1]] >= 2.5 * c[on[0]], c           # the next link on the path is far faster: no close call
    assert cl.on_path() == (exercise.LINKS if cl.nodes > 1 else ("gpu-gpu",))


def test_the_seeds_cover_every_cluster_and_every_limiting_link():
    got = [exercise.mystery_cluster(s) for s in range(80)]
    assert {c.name for c in got} == set(exercise.CLUSTERS)
    assert {_limiting(c) for c in got} == set(exercise.LINKS)
    # one-node runs whose cheapest link is off the path: naming the smallest ceiling is wrong there
    trap = [c for c in got if min(c.ceilings(), key=c.ceilings().get) != _limiting(c)]
    assert trap and all(c.nodes == 1 for c in trap)


@pytest.mark.parametrize("seed", range(12))
def test_the_table_shows_the_limiting_link_near_its_ceiling(seed):
    cl = exercise.mystery_cluster(seed)
    text = cl.table()
    assert text.startswith("# SYNTHETIC") and text == cl.table()           # deterministic per seed
    assert _limiting(cl) not in text.splitlines()[0]                    # the header does not say it
    busbw, n = _busbw(text)
    assert n == cl.nranks
    util = {k: busbw / v for k, v in cl.ceilings().items()}
    assert 0.75 < util[_limiting(cl)] < 0.95, util
    on = [k for k in cl.on_path() if k != _limiting(cl)]
    assert all(util[k] < 0.4 for k in on), util                            # other links on the path: far from full
    hosts = {d.split(" on ")[1].split()[0] for d in comm.parse_nccl_tests(text).devices}
    assert len(hosts) == cl.nodes
    sheet = cl.sheet()
    assert list(sheet.index) == list(exercise.LINKS)
    assert np.allclose(sheet["busbw ceiling (GB/s)"], [cl.ceilings()[k] / 1e9 for k in exercise.LINKS])


def test_an_assignment_is_fixed_by_its_seed():
    a, b = exercise.assignment(7), exercise.assignment(7)
    assert a == b and a.model in exercise.MODELS and a.held_out_bytes in exercise.HELD_OUT
    assert {exercise.assignment(s).model for s in range(40)} == set(exercise.MODELS)
    with pytest.raises(ValueError, match="seed"):
        exercise.assignment(-1)
    with pytest.raises(ValueError, match="seed"):
        exercise.mystery_cluster(1.5)


def test_heldout_tolerance_is_k_times_the_noise_within_its_bounds():
    quiet = [1.0, 1.0, 1.01, 1.02, 1.0, 1.03]
    assert exercise.heldout_tolerance([0.01, -0.02, 0.01], quiet) == 0.25          # floor
    assert exercise.heldout_tolerance([0.1, -0.12, 0.11, 0.2], quiet) == pytest.approx(3 * 0.115)
    noisy = [1.0, 1.0, 1.0, 1.6, 1.7, 1.8, 1.9, 2.0, 2.0, 2.0]
    assert exercise.heldout_tolerance([0.01], noisy) == 1.0                         # capped: a x2 slip still fails
    for bad in ([float("nan")], []):
        with pytest.raises(ValueError, match="fit_rel_errors"):
            exercise.heldout_tolerance(bad, quiet)
    with pytest.raises(ValueError, match="held_times_s"):
        exercise.heldout_tolerance([0.1], [1.0])
    with pytest.raises(ValueError, match="held_times_s"):
        exercise.heldout_tolerance([0.1], [1.0, 0.0])
    with pytest.raises(ValueError, match="floor"):
        exercise.heldout_tolerance([0.1], quiet, floor=2.0)


def _limiting(cl) -> str:
    """The link that limits a mystery cluster's run: on its path, the smallest ceiling (lab 9's q3, worked out here;
    the cluster exposes no attribute that says it)."""
    c = cl.ceilings()
    return min(cl.on_path(), key=c.get)
