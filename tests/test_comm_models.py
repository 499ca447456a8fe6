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


# ----------------------------------------------------------------------------- issue #17
# gather / scatter / hypercube / alltoallv: the *GetBw functions of NVIDIA/nccl-tests src/gather.cu,
# scatter.cu, hypercube.cu, alltoallv.cu (commit a0b82b2): factor (n-1)/n, (n-1)/n, 1, (n-1)/n.
@pytest.mark.parametrize("n", [2, 8, 72])
def test_every_nccl_tests_binary_has_its_factor(n):
    expected = {"all_reduce_perf": 2 * (n - 1) / n, "all_gather_perf": (n - 1) / n, "reduce_scatter_perf": (n - 1) / n,
                "broadcast_perf": 1, "reduce_perf": 1, "alltoall_perf": (n - 1) / n, "alltoallv_perf": (n - 1) / n,
                "sendrecv_perf": 1, "gather_perf": (n - 1) / n, "scatter_perf": (n - 1) / n, "hypercube_perf": 1}
    assert set(expected) == set(comm.NCCL_TESTS)
    for binary, factor in expected.items():
        assert comm.bus_factor(binary, n) == pytest.approx(factor), binary
        assert comm.bus_factor(comm.NCCL_TESTS[binary], n) == pytest.approx(factor), binary
    assert set(comm.NCCL_TESTS.values()) == set(comm.ALL_OPS)
    assert comm.ring_steps("hypercube", 8) == 3 and comm.ring_steps("gather", 8) == 7


def test_nvls_link_factor_and_the_busbw_it_explains():
    # ring: the link carries busbw's factor; NVLS: the switch reduces, each link carries S(1+1/n) each way
    assert comm.link_factor("all_reduce", 8) == comm.bus_factor("all_reduce", 8)
    assert comm.link_factor("all_reduce", 8, algorithm="nvls") == pytest.approx(9 / 8)
    # 8xH100, NVLS on: nccl-tests prints busbw 480 GB/s at algbw 275 GB/s (https://github.com/NVIDIA/nccl/issues/2140);
    # the bytes each NVLink really carried per second: algbw x link factor = 309 GB/s, under the 450 GB/s link
    algbw = 275e9
    assert algbw * comm.bus_factor("all_reduce", 8) == pytest.approx(481e9, rel=0.01)
    assert algbw * comm.link_factor("all_reduce", 8, algorithm="nvls") == pytest.approx(309e9, rel=0.01)
    with pytest.raises(ValueError, match="algorithm='sharp' is not valid"):
        comm.link_factor("all_reduce", 8, algorithm="sharp")
    with pytest.raises(ValueError, match="algorithm='nvls' with op='all_gather'"):
        comm.link_factor("all_gather", 8, algorithm="nvls")


def test_bytes_of_counts_and_nccl_tests_type_names():
    # nccl-tests rows: size = count x sizeof(type) (GB200 row above: 134217728 float = 536870912 B)
    assert comm.bytes_of(134217728, "float") == 536870912
    assert comm.bytes_of(10, "half") == comm.bytes_of(10, "bfloat16") == 20
    assert comm.bytes_of(10, "int8") == comm.bytes_of(10, "f8e4m3") == 10
    assert comm.bytes_of(10, "double") == comm.bytes_of(10, "uint64") == 80
    assert comm.bytes_of(0, "float") == 0 and comm.bytes_of(3, "torch.bfloat16") == 6
    with pytest.raises(ValueError, match=r"dtype='fp12' is not valid: choose one of \[.*'bfloat16'"):
        comm.bytes_of(1, "fp12")
    with pytest.raises(ValueError, match="count=-1 is not valid: use an int >= 0"):
        comm.bytes_of(-1, "float")
    with pytest.raises(ValueError, match="count must be an int"):
        comm.bytes_of(2.5, "float")
    with pytest.raises(ValueError, match="dtype must be a str"):
        comm.bytes_of(1, 4)


def test_live_benchmark_refuses_ops_it_cannot_run():
    with pytest.raises(ValueError, match="'gather' has no torch.distributed benchmark"):
        comm.benchmark(["gather"], nprocs=2)
