"""Parsers of nccl-tests output, NCCL_DEBUG=INFO logs and `nvidia-smi topo -m` (labkit.comm.parse and the files behind it).

Real inputs are SHORT quoted lines of public outputs, cited by URL beside each; whole files are the
SYNTHETIC datasets in datasets/comm/ (see its README).
"""
from __future__ import annotations

import random

import pandas as pd
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
    assert (r.out_of_bounds, r.out_of_bounds_status) == (0, "OK")
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
    # the legacy column is the largest deviation (a float), not a count of wrong elements
    assert (row["oop_time_us"], row["oop_busbw"], row["oop_error"], row["oop_wrong"]) == (3298.6, 20.34, 0.0, None)
    assert row["ip_error"] == 0.0 and row["ip_wrong"] is None
    assert r.format == "old"                   # no header: inferred from the 11 fields
    assert r.avg_busbw == pytest.approx(6.6972)
    r2 = comm.parse_nccl_tests(OLD_HEADER + "\n    1048576   262144   float   sum   47.38  22.13  33.20  0e+00"
                               "   46.84  22.39  33.58  0e+00\n")
    assert r2.format == "old" and r2.rows.iloc[0]["redop"] == "sum" and r2.rows.iloc[0]["root"] is None
    assert r2.rows.iloc[0]["oop_error"] == 0.0 and r2.rows.iloc[0]["oop_wrong"] is None


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


# ----------------------------------------------------------------------------- issue #17: real line formats
# Old nccl-tests (before "Resync with NCCL 2.13", nccl-tests commit 51af557, 2022): the last column of each
# half is "error", the largest deviation (a float printed %5.0le), not a count of wrong elements.
# https://github.com/NVIDIA/nccl-tests/issues/176 (128-GPU all_reduce, header with redop, no root)
OLD_ERROR_HEADER = """\
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        4096          1024     float     sum    93.73    0.04    0.09  1e-06    93.15    0.04    0.09  1e-06
"""
# https://github.com/NVIDIA/nccl-tests/issues/82 (old broadcast: "root" where reductions have "redop",
# the command line, header, device lines and a WARN line of the same run)
OLD_BROADCAST = """\
(base) gandiva@v100-gpu-1:~/nccl-tests$ mpirun --bind-to none -np 2 --host 10.0.0.48:1,10.0.0.52:1 ./build/broadcast_perf -b 8 -e 2G -w 10 -f 2 -g 1 -n 100 -c 0
# nThread 1 nGpus 1 minBytes 8 maxBytes 2147483648 step: 2(factor) warmup iters: 10 iters: 100 validation: 0
#
#       size         count    type    root     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float       0    45.82    0.00    0.00    N/A    38.17    0.00    0.00    N/A
"""
OLD_BROADCAST_RANKS = ("#   Rank  0 Pid  14926 on v100-gpu-1 device  0 [0x00] Tesla V100-PCIE-16GB\n"
                       "#   Rank  1 Pid   9210 on v100-gpu-5 device  0 [0x00] Tesla V100-PCIE-16GB\n")
# https://github.com/NVIDIA/nccl-tests/issues/167 (new format rows, no header pasted; redop max)
NEW_HEADERLESS = ("      199680         49920     float     max      -1    125.8    1.59    2.98      0    125.1    1.60"
                  "    2.99      0\n")


def test_legacy_error_column_is_a_deviation_not_a_wrong_count():
    r = comm.parse_nccl_tests(OLD_ERROR_HEADER)
    assert r.format == "old" and not r.errors
    row = r.rows.iloc[0]
    assert (row["redop"], row["root"], row["oop_busbw"]) == ("sum", None, 0.09)
    assert row["oop_error"] == pytest.approx(1e-6) and row["ip_error"] == pytest.approx(1e-6)
    assert row["oop_wrong"] is None and row["ip_wrong"] is None
    # the same row without its header: 12 fields read as the old layout
    r2 = comm.parse_nccl_tests(OLD_ERROR_HEADER.splitlines()[2])
    assert r2.format == "old" and r2.rows.iloc[0]["oop_error"] == pytest.approx(1e-6)
    # new format: #wrong is a count; a fractional one is a bad line
    new = comm.parse_nccl_tests(GB200)
    assert new.rows["oop_error"].isna().all() and (new.rows["oop_wrong"] == 0).all()
    bad = comm.parse_nccl_tests(GB200.replace("586.06      0", "586.06    0.5"))
    assert len(bad.errors) == 1 and "not a count of wrong elements" in bad.errors[0][1]


def test_old_broadcast_root_column_and_ranks_from_the_command_line():
    r = comm.parse_nccl_tests(OLD_BROADCAST)
    assert r.op == "broadcast" and r.format == "old" and not r.errors
    row = r.rows.iloc[0]
    assert (row["root"], row["redop"], row["oop_time_us"], row["ip_time_us"]) == (0, None, 45.82, 38.17)
    assert row["oop_error"] is None and row["oop_wrong"] is None          # N/A
    # no "Rank N" lines here: mpirun -np 2 x nThread 1 x nGpus 1 (the "-n 100" after the binary is iters)
    assert (r.nranks, r.nranks_from) == (2, "nThread x nGpus x mpirun -np")
    with_ranks = comm.parse_nccl_tests(OLD_BROADCAST.replace("#\n", "#\n" + OLD_BROADCAST_RANKS, 1))
    assert (with_ranks.nranks, with_ranks.nranks_from) == (2, "rank lines")
    # headerless: an integer 4th field is a root, a name is a redop
    headerless = comm.parse_nccl_tests(OLD_BROADCAST.splitlines()[-1])
    assert headerless.format == "old" and headerless.rows.iloc[0]["root"] == 0


def test_format_inferred_without_header_and_ranks_from_ngpus():
    r = comm.parse_nccl_tests(NEW_HEADERLESS)
    assert r.format == "new" and r.rows.iloc[0]["redop"] == "max" and r.rows.iloc[0]["oop_wrong"] == 0
    one_process = comm.parse_nccl_tests("# nThread 1 nGpus 8 minBytes 8 maxBytes 128\n" + NEW_HEADERLESS)
    assert (one_process.nranks, one_process.nranks_from) == (8, "nThread x nGpus")
    cmd = comm.parse_nccl_tests("$ ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 4\n" + NEW_HEADERLESS)
    assert (cmd.op, cmd.nranks) == ("all_reduce", 4)
    assert comm.parse_nccl_tests(NEW_HEADERLESS).nranks is None


def test_out_of_bounds_count_and_status():
    failed = comm.parse_nccl_tests(GB200.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 3 FAILED"))
    assert (failed.out_of_bounds, failed.out_of_bounds_status) == (3, "FAILED")
    junk = comm.parse_nccl_tests(GB200.replace("# Out of bounds values : 0 OK", "# Out of bounds values : lots"))
    assert junk.out_of_bounds is None and "Out of bounds" in junk.errors[0][1]


def test_every_nccl_tests_binary_names_its_op():
    for binary, op in comm.NCCL_TESTS.items():
        r = comm.parse_nccl_tests(f"# Collective test starting: {binary}\n" + NEW_HEADERLESS)
        assert r.op == op, binary


# NCCL's own line layouts (NVIDIA/nccl src/debug.cc, ncclDebugLog): WARN carries "file:line" (recent
# releases add "(function)") between the device and "NCCL WARN". Real lines, with sources:
NCCL_WARN_REAL = """\
c76d92cccb6e:72:456 [0] enqueue.cc:58 NCCL WARN Cuda failure 'named symbol not found'
ubuntu:9621:9621 [0] misc/cudawrap.cc:179 NCCL WARN Failed to find CUDA library libcuda.so (NCCL_CUDA_PATH='') :
ubuntu:9621:9621 [0] NCCL INFO NET/Plugin : No plugin found, using internal implementation
v100-gpu-1:14926:14926 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
H20-GPU-06:4015539:4015652 [0] NCCL INFO 8 coll channels, 0 collnet channels, 0 nvls channels, 8 p2p channels, 2 p2p channels per peer
H20-GPU-05:1789224:1789735 [0] NCCL INFO comm 0x5b41750 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0xf021d9037f9243d8 - Init COMPLETE
swat1-04:2017630:2017669 [0] NCCL INFO Channel 01/08 :    0   5   4   7   6   3  10   9   8  13  12  15  14  11   2   1
"""
# Sources: enqueue.cc https://github.com/NVIDIA/nccl/issues/1528 ; cudawrap.cc and NET/Plugin
# https://github.com/NVIDIA/nccl-tests/issues/166 ; ibvwrap.cc https://github.com/NVIDIA/nccl-tests/issues/82 ;
# channel counts and Init COMPLETE https://github.com/NVIDIA/nccl/issues/1189 ; Channel 01/08
# https://github.com/NVIDIA/nccl/issues/1412
# Built from src/debug.cc's formats (no public example found): the newer WARN with "(function)", and TRACE.
NCCL_FORMATS_FROM_SOURCE = """\
node1:200:201 [3] init.cc:1700 (ncclCommInitRankFunc) NCCL WARN example warning
node1:200:201 [3] 1234.567890 ncclAllReduce:301 NCCL TRACE example trace
"""


def test_real_warn_lines_are_warnings_not_errors():
    info = comm.parse_nccl_debug(NCCL_WARN_REAL)
    assert not info.errors
    assert info.warnings == ["Cuda failure 'named symbol not found'",
                             "Failed to find CUDA library libcuda.so (NCCL_CUDA_PATH='') :",
                             "Failed to open libibverbs.so[.1]"]
    assert info.nranks == 4 and info.n_channels == 8 and info.rings == [[0, 5, 4, 7, 6, 3, 10, 9, 8, 13, 12, 15,
                                                                         14, 11, 2, 1]]
    assert "3 WARN line(s)" in info.summary()


def test_per_line_records():
    info = comm.parse_nccl_debug(NCCL_WARN_REAL + NCCL_FORMATS_FROM_SOURCE)
    t = info.table()
    assert len(t) == len(info.records) == 9 and list(t["line"]) == list(range(1, 10))
    w = t.iloc[0]
    assert (w["host"], w["pid"], w["tid"], w["device"], w["level"], w["file"], w["file_line"]) == (
        "c76d92cccb6e", 72, 456, 0, "WARN", "enqueue.cc", 58)
    assert t.iloc[1]["file"] == "misc/cudawrap.cc" and t.iloc[1]["file_line"] == 179
    assert t.iloc[2]["subsystem"] == "NET/Plugin" and t.iloc[2]["level"] == "INFO" and pd.isna(t.iloc[2]["file"])
    assert t.iloc[4]["n_channels"] == 8                        # "8 coll channels, ... 8 p2p channels"
    init = t.iloc[5]
    assert (init["comm"], init["comm_id"], init["rank"], init["nranks"]) == ("0x5b41750", "0xf021d9037f9243d8", 0, 4)
    assert (t.iloc[6]["channel"], t.iloc[6]["n_channels"]) == (1, 8)
    new_warn, trace = t.iloc[7], t.iloc[8]
    assert (new_warn["level"], new_warn["file"], new_warn["file_line"], new_warn["function"], new_warn["message"]) \
        == ("WARN", "init.cc", 1700, "ncclCommInitRankFunc", "example warning")
    assert (trace["level"], trace["time_ms"], trace["function"], trace["file_line"], trace["device"]) == (
        "TRACE", 1234.56789, "ncclAllReduce", 301, 3)
    assert pd.isna(trace["file"])
    # the headerless version line is a record too, and garbage lines are not
    v = comm.parse_nccl_debug("NCCL version 2.19.3+cuda12.3\nhello\n")
    assert v.table()["level"].tolist() == ["VERSION"]


def test_parsers_name_the_bad_argument():
    for fn in (comm.parse_nccl_tests, comm.parse_nccl_debug):
        with pytest.raises(ValueError, match="text must be a str"):
            fn(None)
    with pytest.raises(ValueError, match="op='allsum' is not a known collective"):
        comm.parse_nccl_tests(GB200, op="allsum")


def test_headerless_old_reduce_row_with_root_keeps_its_deviation():
    # nccl-tests before 51af557: reduce_perf printed "redop root" and the float "error" (src/reduce.cu then);
    # the figures are the all_reduce row of https://github.com/NVIDIA/nccl-tests/issues/176 with a root added
    r = comm.parse_nccl_tests("        4096          1024     float     sum       0    93.73    0.04    0.09  1e-06"
                              "    93.15    0.04    0.09  1e-06")
    assert r.format == "old" and not r.errors
    assert r.rows.iloc[0]["root"] == 0 and r.rows.iloc[0]["oop_error"] == pytest.approx(1e-6)
