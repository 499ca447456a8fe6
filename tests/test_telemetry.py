"""labkit.telemetry: nvidia-smi / dcgmi parsers, synthetic samples, host topology."""
from __future__ import annotations

import math
import shutil

import pytest

from labkit import telemetry as T
from labkit.paths import dataset

# nvidia-smi --query-gpu=...  --format=csv layout (header with units; values with units; [N/A])
QUERY = """timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W]
2024/05/01 12:00:00.100, 0, 100 %, 60000 MiB, 650.10 W
2024/05/01 12:00:00.100, 1, 97 %, 59000 MiB, [N/A]
2024/05/01 12:00:00.600, 0, 100 %, 60000
2024/05/01 12:00:00.600, 1, lots %, 59000 MiB, 600.00 W
2024/05/01 12:00:01.100, 0, 100 %, 60000 MiB, 640.00 W
"""

DMON = """# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    mclk    pclk
# Idx      W      C      C      %      %      %      %     MHz     MHz
    0     43     28      -      0      0      0      0    877    345
    1    612     61     70    100     38      0      0   2619   1980
    1    6
"""

DCGMI = """#Entity   SMACT  SMOCC  TENSO  DRAMA
ID
GPU 0     0.912  0.401  0.512  0.301
GPU 1     N/A    0.400  0.500  0.300
GPX 2     0.1    0.1    0.1    0.1
GPU 3     0.1    0.1
"""


def test_query_gpu_keeps_good_rows_reports_bad():
    t = T.parse_query_gpu(QUERY)
    assert len(t.frame) == 3
    assert t.units["utilization.gpu"] == "%" and t.units["power.draw"] == "W"
    assert math.isnan(t.frame.loc[1, "power.draw"])               # [N/A] -> NaN, row kept
    assert len(t.errors) == 2 and all(e.startswith("line ") for e in t.errors)
    assert list(t.per_gpu().index) == [0, 1]


def test_query_gpu_noheader_and_types():
    t = T.parse_query_gpu("2024/05/01 12:00:00.100, 0, 55, 10, 5000, 300.5, 60, 1980\n")
    assert t.frame.loc[0, "utilization.gpu"] == 55 and t.errors == []
    assert T.parse_query_gpu("").errors == ["empty input"]
    with pytest.raises(TypeError, match="str"):
        T.parse_query_gpu(None)


def test_smi_dmon_and_dcgmi_parsers():
    d = T.parse_smi_dmon(DMON)
    assert list(d.frame["gpu"]) == [0, 1] and math.isnan(d.frame.loc[0, "mtemp"])
    assert d.frame.loc[1, "sm"] == 100 and len(d.errors) == 1
    g = T.parse_dcgmi_dmon(DCGMI)
    assert list(g.frame["gpu"]) == [0, 1]
    assert g.frame.loc[0, "TENSO"] == pytest.approx(0.512) and math.isnan(g.frame.loc[1, "SMACT"])
    assert len(g.errors) == 2
    assert T.parse_dcgmi_dmon("GPU 0 0.1\n").errors[-1] == "no header line found"
    assert T.DCGM_FIELDS[1004].short == "TENSO" and T.DCGM_FIELDS[1002].name == "DCGM_FI_PROF_SM_ACTIVE"


def test_synthetic_util_is_not_sm_activity():
    lb = T.synthesize_telemetry("launch_bound", seconds=1.0, interval_s=0.5)
    ok = T.synthesize_telemetry("healthy", seconds=1.0, interval_s=0.5)
    q, d = T.parse_query_gpu(lb["query_gpu"]), T.parse_dcgmi_dmon(lb["dcgmi_dmon"])
    assert q.errors == [] and d.errors == []
    assert lb["query_gpu"].startswith("# SYNTHETIC")
    assert q.frame["utilization.gpu"].min() >= 95                   # "100%" busy...
    assert d.frame["SMACT"].max() < 0.15                             # ...on a few SMs
    h = T.parse_dcgmi_dmon(ok["dcgmi_dmon"]).frame
    assert h["TENSO"].median() > 5 * d.frame["TENSO"].median()
    assert T.synthesize_telemetry("healthy", seed=3, seconds=1.0) == T.synthesize_telemetry("healthy", seed=3, seconds=1.0)
    with pytest.raises(ValueError, match="scenario"):
        T.synthesize_telemetry("nope")
    with pytest.raises(ValueError, match="interval_s"):
        T.synthesize_telemetry("healthy", seconds=1, interval_s=2)


def test_tensor_flops_estimate():
    assert T.tensor_flops_estimate(0.5, 989e12) == pytest.approx(494.5e12)
    with pytest.raises(ValueError, match="tensor_active"):
        T.tensor_flops_estimate(50, 989e12)


def test_cpulist_lscpu_and_this_machine(tmp_path):
    assert T.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    with pytest.raises(ValueError, match="5-2"):
        T.parse_cpulist("5-2")
    with pytest.raises(ValueError, match="x"):
        T.parse_cpulist("0,x")
    node = tmp_path / "devices/system/node"
    for n, cpus in ((0, "0-1"), (1, "2-3")):
        (node / f"node{n}").mkdir(parents=True)
        (node / f"node{n}" / "cpulist").write_text(cpus + "\n")
    lscpu = "Model name:  Test CPU\nCPU(s): 4\nSocket(s): 2\nThread(s) per core: 1\n"
    topo = T.cpu_topology(sys_root=tmp_path, lscpu_text=lscpu)
    assert topo.numa == {0: [0, 1], 1: [2, 3]} and topo.sockets == 2 and topo.node_of(3) == 1
    assert "node1: 2-3" in topo.summary()
    here = T.cpu_topology()                                          # the real machine
    assert here.allowed and set(here.allowed) <= {c for cs in here.numa.values() for c in cs} | set(here.allowed)


def test_topology_text_parses_with_comm_and_affinity_plan():
    from labkit import comm

    topo = comm.parse_topology(T.synthesize_topology("dgx-h100"))
    assert topo.errors == [] and len(topo.gpus) == 8 and topo.nvlinks("GPU0", "GPU7") == 18
    plan = T.affinity_plan(topo)
    assert list(plan["numa_node"]) == [0] * 4 + [1] * 4
    assert plan.loc[0, "command"].startswith("numactl --cpunodebind=0 --membind=0")
    pcie = comm.parse_topology(T.synthesize_topology("pcie-4gpu"))
    assert pcie.link("GPU0", "GPU2") == "SYS" and pcie.nvlinks("GPU0", "GPU1") == 0
    with pytest.raises(ValueError, match="system"):
        T.synthesize_topology("dgx-a1")


def test_sample_without_nvidia_smi():
    if shutil.which("nvidia-smi"):
        t = T.sample(0.5, interval_ms=100)
        assert len(t.frame) >= 1
    else:
        with pytest.raises(RuntimeError, match="not on PATH"):
            T.sample(0.5)
    with pytest.raises(ValueError, match="interval_ms"):
        T.sample(1.0, interval_ms=1)


def test_shipped_dataset_is_what_the_generator_makes(tmp_path):
    T.build_dataset(tmp_path)
    for p in sorted(tmp_path.iterdir()):
        assert dataset("telemetry", p.name).read_text() == p.read_text()
        assert "SYNTHETIC" in p.read_text().splitlines()[0]


def test_busy_vs_flops_measures_both_sizes():
    df = T.busy_vs_flops((8, 64), seconds=0.05)
    assert list(df["n"]) == [8, 64] and (df["flops_per_s"] > 0).all() and df["share_of_best"].max() == 1.0
    assert ((df["busy_share"] > 0) & (df["busy_share"] <= 1)).all()
    with pytest.raises(ValueError, match="dtype"):
        T.busy_vs_flops((8,), seconds=0.01, dtype="fp16")


def test_sample_with_a_fake_nvidia_smi(tmp_path):
    """sample() runs the tool, stops it at the deadline and parses what it printed (fake executable)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "echo 'timestamp, index, utilization.gpu [%], memory.used [MiB]'\n"
                    "echo '2024/05/01 12:00:00.100, 0, 100 %, 500 MiB'\n"
                    "echo '2024/05/01 12:00:00.600, 0, 97 %, 500 MiB'\n"
                    "exec sleep 5\n")
    fake.chmod(0o755)
    t = T.sample(0.5, interval_ms=100, fields=("timestamp", "index", "utilization.gpu", "memory.used"),
                 nvidia_smi=str(fake))
    assert list(t.frame["utilization.gpu"]) == [100, 97] and t.errors == []
    assert "--query-gpu=timestamp,index,utilization.gpu,memory.used" in t.source
