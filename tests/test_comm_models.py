"""busbw conventions and α–β models (labkit.comm.models).

Factors: NVIDIA/nccl-tests doc/PERFORMANCE.md ("Summary": AllReduce 2(n-1)/n, ReduceScatter (n-1)/n,
AllGather (n-1)/n, Broadcast 1, Reduce 1, AlltoAll (n-1)/n),
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
"""
from __future__ import annotations

import numpy as np
import pytest

from labkit import comm


@pytest.mark.parametrize("n", [2, 4, 8, 72])
def test_bus_factors_match_nccl_tests(n):
    assert comm.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    assert comm.bus_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
    assert comm.bus_factor("all_gather", n) == pytest.approx((n - 1) / n)
    assert comm.bus_factor("all_to_all", n) == pytest.approx((n - 1) / n)
    assert comm.bus_factor("broadcast", n) == 1.0
    assert comm.bus_factor("reduce", n) == 1.0
    assert comm.bus_factor("send_recv", n) == 1.0


def test_names_and_bad_input():
    assert comm.canonical_op("all_reduce_perf") == "all_reduce"
    assert comm.canonical_op("AllGather") == "all_gather"
    assert comm.canonical_op("alltoall") == "all_to_all"
    with pytest.raises(ValueError, match="op='allsum' is not a known collective"):
        comm.bus_factor("allsum", 4)
    with pytest.raises(ValueError, match="nranks=0"):
        comm.bus_factor("all_reduce", 0)
    with pytest.raises(ValueError, match="time_s=0"):
        comm.algbw("all_reduce", 100, 0)


def test_algbw_busbw_seed_case_bert_large_over_pcie():
    # seed case 004: 1.3 GB of fp32 gradients all-reduced in 120 ms per step over PCIe (4 GPUs assumed here)
    S, t = 1.3e9, 0.120
    assert comm.algbw("all_reduce", S, t) == pytest.approx(10.83e9, rel=1e-3)
    assert comm.busbw("all_reduce", S, t, 4) == pytest.approx(10.83e9 * 1.5, rel=1e-3)


def test_ring_model_steps_and_bandwidth_term():
    n, a, b = 8, 5e-6, 1 / 20e9
    # 2(n-1) steps of reduce-scatter + all-gather (Patarasuk & Yuan 2009; Thakur et al. 2005)
    assert comm.ring_steps("all_reduce", n) == 14
    assert comm.ring_time("all_reduce", 0, n, alpha=a, beta=b) == pytest.approx(14 * a)
    big = comm.ring_time("all_reduce", 1e9, n, alpha=0, beta=b)
    # a bandwidth-bound ring's busbw equals the link bandwidth 1/beta
    assert comm.busbw("all_reduce", 1e9, big, n) == pytest.approx(20e9)
    # all-reduce = reduce-scatter + all-gather
    assert comm.ring_time("all_reduce", 1e8, n, alpha=a, beta=b) == pytest.approx(
        comm.ring_time("reduce_scatter", 1e8, n, alpha=a, beta=b) + comm.ring_time("all_gather", 1e8, n, alpha=a, beta=b))
    assert comm.ring_time("all_reduce", 1e8, 1, alpha=a, beta=b) == 0.0


def test_tree_beats_ring_only_for_small_messages_at_scale():
    n, a, b = 8, 10e-6, 1 / 20e9   # one node: ring 14α + 1.75·Sβ vs tree 6α + 2·Sβ
    small, large = 4096, 1e9
    assert comm.tree_time("all_reduce", small, n, alpha=a, beta=b) < comm.ring_time("all_reduce", small, n, alpha=a, beta=b)
    assert comm.tree_time("all_reduce", large, n, alpha=a, beta=b) > comm.ring_time("all_reduce", large, n, alpha=a, beta=b)
    # unpipelined binomial tree pays S at each of log2 n levels
    assert comm.tree_time("broadcast", large, 8, alpha=0, beta=b, pipelined=False) == pytest.approx(3 * large * b)
    with pytest.raises(ValueError, match="tree_time models"):
        comm.tree_time("all_gather", 1, 4, alpha=a, beta=b)


def test_hierarchical_model_network_bound():
    # 2 nodes x 8: intra 22 GB/s, inter 25 Gb/s shared by 8 ranks; the network part dominates
    kw = dict(alpha=3e-6, beta=1 / 22e9, ranks_per_node=8, alpha_inter=25e-6, beta_inter=8 / 3.125e9)
    t = comm.hierarchical_time("all_reduce", 1e9, 16, **kw)
    inter = comm.ring_time("all_reduce", 1e9 / 8, 2, alpha=25e-6, beta=8 / 3.125e9)
    assert inter / t > 0.7
    assert comm.hierarchical_time("all_reduce", 1e9, 8, **kw) == pytest.approx(
        comm.ring_time("all_reduce", 1e9, 8, alpha=3e-6, beta=1 / 22e9))
    with pytest.raises(ValueError, match="not a multiple of ranks_per_node"):
        comm.hierarchical_time("all_reduce", 1e9, 12, **kw)


def test_fit_recovers_alpha_beta_and_resists_outliers():
    rng = np.random.default_rng(0)
    sizes = np.array([2**k for k in range(10, 25)], dtype=float)
    true = comm.AlphaBeta(alpha_s=20e-6, beta_s_per_byte=1 / 5e9, op="all_reduce", nranks=4)
    t = true.predict(sizes) * rng.lognormal(0, 0.03, sizes.size)
    t[3] *= 4.0   # one straggling small-size sample
    fit = comm.fit_alpha_beta(sizes, t, "all_reduce", 4)
    assert fit.alpha_s == pytest.approx(20e-6, rel=0.15)
    assert fit.bandwidth == pytest.approx(5e9, rel=0.1)
    assert "alpha" in fit.summary()
    with pytest.raises(ValueError, match="2 distinct sizes"):
        comm.fit_alpha_beta([1, 1], [1e-3, 1e-3])
    with pytest.raises(ValueError, match="times_s must be finite"):
        comm.fit_alpha_beta([1, 2], [1e-3, -1])


def test_synthetic_generator_is_seeded_and_labelled():
    a = comm.synthetic_nccl_tests("pcie-node", seed=3, max_bytes=2**20)
    assert a == comm.synthetic_nccl_tests("pcie-node", seed=3, max_bytes=2**20)
    assert a != comm.synthetic_nccl_tests("pcie-node", seed=4, max_bytes=2**20)
    assert a.splitlines()[0].startswith("# SYNTHETIC")
    with pytest.raises(ValueError, match="fabric='dgx9' unknown"):
        comm.synthetic_nccl_tests("dgx9")
