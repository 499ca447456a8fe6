"""Parsers of nccl-tests output, NCCL_DEBUG=INFO logs and `nvidia-smi topo -m` (labkit.comm.parse and the files behind it).

Real inputs are SHORT quoted lines of public outputs, cited by URL beside each; whole files are the
SYNTHETIC datasets in datasets/comm/ (see its README).
"""
from __future__ import annotations

import random

import pytest

from labkit import comm
from labkit.paths import dataset

# https://github.com/coreweave/nccl-tests/pull/43 (GB200 NVL72, 72 ranks, new format)
GB200 = """\
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   536870912     134217728     float     sum      -1   1806.7  297.16  586.06      0   1835.9  292.43  576.74      0
  4294967296    1073741824     float     sum      -1    10094  425.49  839.16      0    10141  423.54  835.32      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 745.53
"""

# https://github.com/aws/aws-k8s-tester/pull/503 (mpirun --tag-output prefixes, p5.48xlarge)
AWS_PREFIXED = """\
[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw  #wrong
[1,0]<stdout>:           8             2     float     sum      -1    12.90    0.00    0.00      0    12.87    0.00    0.00      0
[1,0]<stdout>:          32             8     float     sum      -1    22.25    0.00    0.00      0    13.34    0.00    0.00      0
[1,0]<stdout>:# Avg bus bandwidth    : 92.3405
"""

# https://github.com/li-plus/playground/blob/master/cuda/nccl.md (sendrecv_perf: in-place #wrong is N/A)
SENDRECV_NA = ("   134217728      33554432     float     sum      -1   1211.2  110.81  110.81      0   "
               "1211.8  110.76  110.76    N/A")

# https://github.com/NVIDIA/nccl/issues/340 (NCCL 2.6.4 era: old format, no redop/root, 'error' column)
OLD_NO_REDOP = """\
     1048576        131072   float    47.38   11.06   11.06  0e+00    46.84   11.19   11.19  0e+00
   134217728      16777216   float   3298.6   20.34   20.34  0e+00   3070.3   21.86   21.86  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 6.6972
"""

# https://github.com/NVIDIA/nccl-tests/issues/107 (old header with redop, no root)
OLD_HEADER = "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error"

# https://github.com/NVIDIA/nccl/issues/1453 (a data row interleaved with an NCCL INFO line: mixed input)
MIXED = ("[0]           64            16     float     sum      -1[0] h100clust-worker-1:497888:497888 [0] "
         "NCCL INFO 64 Bytes -> Algo 0 proto 0 time 25.207382")


def test_new_format_rows_field_by_field():
    r = comm.parse_nccl_tests(GB200)
    assert r.format == "new" and not r.errors
    row = r.rows.iloc[0]
    assert (row["size"], row["count"], row["type"], row["redop"], row["root"]) == (536870912, 134217728, "float",
                                                                                    "sum", -1)
    assert (row["oop_time_us"], row["oop_algbw"], row["oop_busbw"], row["oop_wrong"]) == (1806.7, 297.16, 586.06, 0)
    assert (row["ip_time_us"], row["ip_algbw"], row["ip_busbw"]) == (1835.9, 292.43, 576.74)
    assert r.rows.iloc[1]["oop_time_us"] == 10094
    assert r.avg_busbw == pytest.approx(745.53)
    assert r.out_of_bounds == "0 OK"
    # busbw/algbw of a 72-rank all_reduce is nccl-tests' 2(n-1)/n
    assert r.implied_bus_factor().iloc[0] == pytest.approx(comm.bus_factor("all_reduce", 72), rel=1e-3)
    # and algbw = S / t (GB/s = 1e9 B/s, t in us)
    assert comm.algbw("all_reduce", row["size"], row["oop_time_us"] * 1e-6) / 1e9 == pytest.approx(297.16, rel=1e-3)


def test_mpirun_prefixes_are_stripped():
    r = comm.parse_nccl_tests(AWS_PREFIXED)
    assert list(r.rows["size"]) == [8, 32] and not r.errors
    assert r.rows.iloc[1]["oop_time_us"] == 22.25 and r.rows.iloc[1]["ip_time_us"] == 13.34
    assert r.avg_busbw == pytest.approx(92.3405)


def test_na_wrong_column_is_none():
    row = comm.parse_nccl_tests(SENDRECV_NA).rows.iloc[0]
    assert row["oop_wrong"] == 0 and row["ip_wrong"] is None
    assert row["ip_busbw"] == 110.76


def test_old_formats():
    r = comm.parse_nccl_tests(OLD_NO_REDOP)
    assert not r.errors and len(r.rows) == 2
    row = r.rows.iloc[1]
    assert (row["size"], row["count"], row["type"], row["redop"]) == (134217728, 16777216, "float", None)
    assert (row["oop_time_us"], row["oop_busbw"], row["oop_wrong"]) == (3298.6, 20.34, 0.0)
    assert r.avg_busbw == pytest.approx(6.6972)
    r2 = comm.parse_nccl_tests(OLD_HEADER + "\n    1048576   262144   float   sum   47.38  22.13  33.20  0e+00"
                               "   46.84  22.39  33.58  0e+00\n")
    assert r2.format == "old" and r2.rows.iloc[0]["redop"] == "sum" and r2.rows.iloc[0]["root"] is None


def test_mixed_line_is_reported_not_fatal():
    r = comm.parse_nccl_tests(GB200 + MIXED + "\n")
    assert len(r.rows) == 2
    assert len(r.errors) == 1 and "fields" in r.errors[0][1]


def test_synthetic_datasets_round_trip():
    text = dataset("comm", "nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt").read_text()
    assert text.startswith("# SYNTHETIC")
    r = comm.parse_nccl_tests(text)
    assert r.op == "all_reduce" and r.nranks == 16 and not r.errors
    # the large-message busbw sits just under the 25 Gb/s Ethernet line rate (3.125 GB/s)
    assert 2.5 < r.rows["oop_busbw"].iloc[-1] < 3.125
    ag = comm.parse_nccl_tests(dataset("comm", "nccl_tests_all_gather_h100_nvlink_8gpu.SYNTHETIC.txt").read_text())
    big = ag.rows[ag.rows["size"] > 2**20]
    assert ag.op == "all_gather"
    assert (big["oop_busbw"] / big["oop_algbw"]).median() == pytest.approx(7 / 8, rel=0.02)


# ----------------------------------------------------------------------------- NCCL_DEBUG=INFO
NCCL_INFO_REAL = """\
NCCL version 2.19.3+cuda12.3
axa:3048391:3048566 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
axa:3048391:3048566 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo
axa:3048391:3048566 [0] NCCL INFO Using network Socket
qh100-gpu20:39634:39692 [5] NCCL INFO comm 0x5558e3c10180 rank 13 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0
SH-IDC1-10-198-34-101:140129:140202 [0] NCCL INFO Channel 01/02 :    0   3   2   1   4   7   6   5
SH-IDC1-10-198-34-101:140129:140202 [0] NCCL INFO Trees [0] 1/4/-1->0->-1 [1] 1/-1/-1->0->4
SH-IDC1-10-198-34-101:140129:140202 [0] NCCL INFO Channel 00/0 : 5[2c000] -> 0[26000] [receive] via NET/IB/0/GDRDMA
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
tj5-sc-ai-h800r-dev01:533:1765 [2] NCCL INFO Channel 07 : 2[6] -> 3[7] via SHM/direct/direct
Wed Sep  6 17:26:52 2023[1,7]<stdout>:tomte249:86390:88868 [7] NCCL INFO Using network IB
"""
# Sources, line by line: version line https://github.com/NVIDIA/nccl/issues/1267 ; NCCL_* settings and
# "Using network Socket" https://github.com/NVIDIA/nccl/issues/1053 ; comm/nRanks/nNodes
# https://github.com/NVIDIA/nccl/issues/1357 ; ring order, Trees and NET/IB/GDRDMA
# https://github.com/NVIDIA/nccl-tests/issues/128 ; NET/Socket and P2P/IPC https://github.com/NVIDIA/nccl/issues/952 ;
# SHM https://github.com/NVIDIA/nccl/issues/1609 ; timestamped mpirun prefix https://github.com/NVIDIA/nccl/issues/957


def test_nccl_debug_real_lines_field_by_field():
    info = comm.parse_nccl_debug(NCCL_INFO_REAL)
    assert (info.version, info.cuda) == ("2.19.3", "12.3")
    assert info.env == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}
    assert info.nranks == 16 and info.nnodes == 2
    assert info.rings == [[0, 3, 2, 1, 4, 7, 6, 5]]
    assert info.n_channels == 8           # highest channel index seen: "Channel 07 : ..." + 1
    assert info.trees == ["1/4/-1->0->-1", "1/-1/-1->0->4"]
    assert info.transports == {"NET/IB/GDRDMA": 1, "NET/Socket": 1, "P2P/IPC": 1, "SHM": 1}
    assert info.network == "IB"           # the last "Using network" line wins
    assert {"axa", "qh100-gpu20", "<cluster_name>", "tomte249"} <= set(info.hosts)
    assert not info.errors


def test_nccl_debug_synthetic_log_and_summary():
    info = comm.parse_nccl_debug(dataset("comm", "nccl_debug_2node_25gbe.SYNTHETIC.log").read_text())
    assert info.nranks == 16 and info.nnodes == 2 and info.network == "Socket"
    assert info.transports["NET/Socket"] > 0 and info.transports["P2P/IPC"] > 0
    assert "TCP sockets" in info.summary()
    assert info.env["NCCL_IB_DISABLE"] == "1"


def test_nccl_debug_warn_and_headerless_lines():
    info = comm.parse_nccl_debug("h:1:2 [0] NCCL WARN NET/Socket : peer closed\nsome NCCL INFO without header\n")
    assert info.warnings == ["NET/Socket : peer closed"]
    assert len(info.errors) == 1


# ----------------------------------------------------------------------------- nvidia-smi topo -m
# https://github.com/noonghunna/club-3090/issues/1229 (tab-separated, 2 GPUs, NUMA columns)
TOPO_2GPU = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tPHB\t0-63\t0\t\tN/A\n"
             "GPU1\tPHB\t X \t0-63\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
             "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
             "  NV#  = Connection traversing a bonded set of # NVLinks\n")
# https://github.com/kubernetes/kubernetes/issues/53497 (space-separated, a NIC column, two CPU sockets)
TOPO_K8S = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    mlx4_0  CPU Affinity
GPU0     X      PIX     PHB     PHB     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU1    PIX      X      PHB     PHB     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU3    PHB     PHB     PIX      X      SYS     SYS     SYS     SYS     PHB     0-9,20-29
"""


def test_topology_real_matrices():
    t = comm.parse_topology(TOPO_2GPU)
    assert t.devices == ["GPU0", "GPU1"] and t.link("GPU0", "GPU1") == "PHB"
    assert t.cpu_affinity == {"GPU0": "0-63", "GPU1": "0-63"} and t.numa_affinity == {"GPU0": "0", "GPU1": "0"}
    assert t.legend["X"] == "Self" and t.legend["NV#"].startswith("Connection traversing a bonded")
    k = comm.parse_topology(TOPO_K8S)
    assert k.devices[-1] == "mlx4_0" and len(k.devices) == 9
    assert k.link("GPU0", "GPU1") == "PIX" and k.link("GPU0", "GPU4") == "SYS" and k.link("GPU3", "mlx4_0") == "PHB"
    assert k.cpu_affinity["GPU3"] == "0-9,20-29"
    assert k.nvlinks("GPU0", "GPU1") == 0
    with pytest.raises(ValueError, match="no link"):
        k.link("GPU0", "GPU9")


def test_topology_synthetic_dgx():
    t = comm.parse_topology(dataset("comm", "topo_dgx_h100_like.SYNTHETIC.txt").read_text())
    assert len(t.gpus) == 8 and t.nvlinks("GPU0", "GPU7") == 18
    assert t.link("GPU0", "NIC0") == "PXB" and t.link("GPU0", "NIC4") == "SYS"   # NIC behind its GPU's switch
    assert t.nic_names["NIC3"] == "mlx5_3" and set(t.numa_affinity.values()) == {"0", "1"}


def test_detect_and_parse_dispatch():
    assert comm.detect_format(GB200) == "nccl-tests"
    assert comm.detect_format(NCCL_INFO_REAL) == "nccl-debug"
    assert comm.detect_format(TOPO_K8S) == "topology"
    kind, _ = comm.parse(TOPO_2GPU)
    assert kind == "topology"
    with pytest.raises(ValueError, match="not nccl-tests output"):
        comm.parse("hello world")
    with pytest.raises(TypeError, match="text must be a str"):
        comm.parse_nccl_tests(b"bytes")


# ----------------------------------------------------------------------------- fuzz-ish robustness
def _mutate(line: str, rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0 and line:
        return line[: rng.randrange(len(line))]                       # truncate
    if kind == 1:
        toks = line.split()
        if toks:
            toks[rng.randrange(len(toks))] = rng.choice(["nan?", "-5", "x", "1e", "N/A", "#", "\x00"])
        return "   ".join(toks)
    if kind == 2:
        return line + " " + rng.choice(["garbage", "12", "NCCL INFO", "[0]"])
    if kind == 3:
        return "".join(rng.sample(line, len(line))) if line else line  # shuffle characters
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))).decode("latin-1")
    return line


@pytest.mark.parametrize("seed", range(6))
def test_parsers_survive_random_mutations(seed):
    rng = random.Random(seed)
    base = dataset("comm", "nccl_tests_all_reduce_h100_nvlink_8gpu.SYNTHETIC.txt").read_text().splitlines()
    clean = comm.parse_nccl_tests("\n".join(base))
    lines, kept = [], 0
    for ln in base:
        if ln and ln[0] == " " and rng.random() < 0.3:
            lines.append(_mutate(ln, rng))
        else:
            lines.append(ln)
            kept += ln.startswith(" ")
    r = comm.parse_nccl_tests("\n".join(lines))
    assert len(r.rows) >= kept                     # every untouched row is kept
    assert len(r.rows) <= len(clean.rows) + 5      # mutations rarely make new valid rows
    for n, reason, _ in r.errors:
        assert isinstance(n, int) and reason
    # the other parsers never raise on the same garbage, nor on their own mutated inputs
    comm.parse_nccl_debug("\n".join(lines))
    comm.parse_topology("\n".join(lines))
    dbg = dataset("comm", "nccl_debug_h100_nvlink_8gpu.SYNTHETIC.log").read_text().splitlines()
    info = comm.parse_nccl_debug("\n".join(_mutate(x, rng) if rng.random() < 0.3 else x for x in dbg))
    assert info.n_lines > 0
    topo = dataset("comm", "topo_dgx_h100_like.SYNTHETIC.txt").read_text().splitlines()
    t = comm.parse_topology("\n".join(_mutate(x, rng) if rng.random() < 0.3 and i > 2 else x
                                      for i, x in enumerate(topo)))
    assert t.devices                                   # header kept → good rows kept, bad rows reported
    assert len(t.links) + len(t.errors) >= 1
