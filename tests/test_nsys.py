"""labkit.nsys: nsys stats CSV parser, SQLite export reader, analysis, synthetic reports; labkit.measure.streams
(chapter 7's model of a CUDA stream, formerly in labkit.nsys)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from labkit import nsys
from labkit.measure import streams
from labkit.paths import dataset

# Shape of `nsys stats --report nvtx_sum --format csv` (columns of the nsys 2023+ report scripts).
NVTX_CSV = """Processing [report.sqlite] with [/opt/nvidia/nsight-systems/2024.2.1/host-linux-x64/reports/nvtx_sum.py]...

 ** NVTX Range Summary (nvtx_sum):

Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range
95.0,3481709,1,3481709.0,3481709.0,3481709,3481709,0.0,PushPop,:Profile_Loop
5.0,182472,1,182472.0,182472.0,182472,182472,0.0,PushPop,:Warmup

Processing [report.sqlite] with [/opt/nvidia/nsight-systems/2024.2.1/host-linux-x64/reports/cuda_gpu_kern_sum.py]...

 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
80.0,8000,4,2000.0,2000.0,1900,2100,80.0,"void add_kernel<float>(int, float*, float*)"
20.0,2000,1,2000.0,2000.0,2000,2000,0.0,ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)
"""


def test_parse_stats_csv_reads_reports_and_names():
    st = nsys.parse_stats_csv(NVTX_CSV)
    assert st.errors == []
    nv = st["nvtx_sum"]
    assert list(nv["name"]) == ["Profile_Loop", "Warmup"]          # leading ':' (default domain) dropped
    assert nv["total_ns"].sum() == 3481709 + 182472
    k = st["cuda_gpu_kern_sum"]
    assert k.loc[0, "name"] == "void add_kernel<float>(int, float*, float*)"   # quoted comma kept
    assert k.loc[0, "count"] == 4
    top = st.top("cuda_gpu_kern_sum", 1)
    assert top.loc[0, "share"] == pytest.approx(0.8)


def test_parse_stats_csv_keeps_good_rows_and_reports_bad_ones():
    bad = NVTX_CSV.replace("5.0,182472,1,182472.0", "5.0,abc,1,182472.0")
    truncated = bad + "20.0,2000,1,2000.0,20"                       # file cut mid-row
    st = nsys.parse_stats_csv(truncated)
    assert len(st["nvtx_sum"]) == 1 and len(st["cuda_gpu_kern_sum"]) == 2
    assert len(st.errors) == 2
    assert any("number" in e for e in st.errors) and any("fields" in e for e in st.errors)
    assert all(e.startswith("line ") for e in st.errors)


def test_parse_stats_csv_detects_report_without_banner_and_rejects_non_text():
    st = nsys.parse_stats_csv("Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),"
                              "StdDev (ns),Name\n90.0,900,3,300.0,300.0,290,310,10.0,cudaLaunchKernel\n")
    assert st["cuda_api_sum"].loc[0, "count"] == 3
    with pytest.raises(KeyError, match="cuda_api_sum"):
        nsys.parse_stats_csv("")["cuda_api_sum"]
    with pytest.raises(TypeError, match="str"):
        nsys.parse_stats_csv(b"bytes")


def test_synthetic_report_roundtrips_through_stats_csv(tmp_path):
    db = nsys.synthesize_report(tmp_path / "r.sqlite", seed=1, steps=2, layers=2)
    tl = nsys.read_sqlite(db)
    assert "SYNTHETIC" in tl.synthetic
    st = nsys.stats_from_timeline(tl)
    back = nsys.parse_stats_csv(nsys.to_stats_csv(st))
    assert back.errors == []
    k0, k1 = st["cuda_gpu_kern_sum"], back["cuda_gpu_kern_sum"]
    assert list(k0["name"]) == list(k1["name"])
    np.testing.assert_allclose(k0["total_ns"], k1["total_ns"], rtol=1e-9)
    # kernel count follows the model: per layer 8 fwd + 10 bwd + 1 nccl, plus lm head + 2 adam per step
    assert len(tl.kernels) == 2 * (2 * (8 + 10 + 1) + 1 + 2)


def test_analysis_finds_the_host_sync_idle_gaps(tmp_path):
    sync = nsys.analyze(nsys.read_sqlite(nsys.synthesize_report(tmp_path / "a.sqlite", steps=3, data_ms=5.0)))
    free = nsys.analyze(nsys.read_sqlite(nsys.synthesize_report(tmp_path / "b.sqlite", steps=3, data_ms=5.0,
                                                                host_sync=False, pinned=True)))
    # with .item() each step's data time (~5 ms) is GPU idle: one gap per step boundary
    assert len(sync.gaps) == 2 and (sync.gaps["gap_ms"] > 4).all()
    assert set(sync.gaps["nvtx"]) == {"data"}
    assert free.gpu_busy_share > sync.gpu_busy_share + 0.1
    assert 0 < sync.nccl_overlap <= 1
    assert "GPU busy" in sync.summary()
    row = sync.nvtx_gpu.set_index("range").loc["backward"]
    assert row["gpu_span_ms"] > row["cpu_ms"]          # the CPU launches faster than the GPU runs


def test_steady_step_hides_host_work_until_it_outlasts_the_gpu_step(tmp_path):
    """Without the sync the CPU loads batch n+1 while the GPU runs step n: the steady step stays at the GPU's
    step until the host's data time is longer; window / steps also counts the first batch's load (issue #22)."""
    def an(data_ms, sync):
        db = nsys.synthesize_report(tmp_path / f"{data_ms}_{sync}.sqlite", steps=4, data_ms=data_ms,
                                    host_sync=sync, pinned=not sync)
        return nsys.analyze(nsys.read_sqlite(db))

    gpu = an(0.0, False).step_ms
    assert an(4.0, False).step_ms == pytest.approx(gpu, rel=0.02)
    assert an(8.0, False).step_ms == pytest.approx(gpu, rel=0.02)
    assert an(8.0, False).window_ms / 4 > gpu + 1.5          # the first batch's 8 ms, spread over 4 steps
    assert an(24.0, False).step_ms > 24.0 > gpu              # longer than the GPU's step: the host bounds it
    assert an(8.0, True).step_ms == pytest.approx(an(0.0, True).step_ms + 8.0, rel=0.05)   # sync: all exposed
    assert "steady step" in an(4.0, False).summary()


def test_kernel_class_names():
    assert nsys.kernel_class("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "nccl"
    assert nsys.kernel_class("void flash_fwd_kernel<cutlass::bfloat16_t>") == "attention"
    assert nsys.kernel_class("sm90_xmma_gemm_bf16bf16") == "gemm"
    assert nsys.kernel_class("void at::native::vectorized_elementwise_kernel") == "elementwise/other"


def test_read_sqlite_rejects_other_files(tmp_path):
    p = tmp_path / "x.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (a INTEGER)")
    con.close()
    with pytest.raises(ValueError, match="not an nsys export"):
        nsys.read_sqlite(p)
    (tmp_path / "y.sqlite").write_text("not sqlite at all" * 100)
    with pytest.raises(ValueError, match="y.sqlite"):
        nsys.read_sqlite(tmp_path / "y.sqlite")
    with pytest.raises(FileNotFoundError):
        nsys.read_sqlite(tmp_path / "missing.sqlite")
    with pytest.raises(ValueError, match="steps"):
        nsys.synthesize_report(tmp_path / "z.sqlite", steps=0)


def test_shipped_dataset_is_what_the_generator_makes(tmp_path):
    nsys.build_dataset(tmp_path)
    for stem in nsys.DATASETS:
        shipped = nsys.read_sqlite(dataset("nsys", f"{stem}.sqlite"))
        fresh = nsys.read_sqlite(tmp_path / f"{stem}.sqlite")
        assert shipped.kernels.equals(fresh.kernels) and shipped.nvtx.equals(fresh.nvtx)
        assert dataset("nsys", f"{stem}_stats.csv").read_text() == (tmp_path / f"{stem}_stats.csv").read_text()


def test_toy_stream_is_asynchronous_and_ordered():
    import time

    order = []
    with streams.ToyStream() as s:
        t = time.perf_counter()
        s.launch(time.sleep, 0.05)
        s.launch(order.append, "second")
        launched = time.perf_counter() - t
        s.synchronize()
        done = time.perf_counter() - t
    assert launched < 0.03 <= 0.05 <= done            # launch returns at once; synchronize waits for the work
    assert order == ["second"]
    with pytest.raises(ValueError, match="host_ms"):
        streams.async_timing_demo(host_ms=-1)


def test_stream_model_keeps_its_old_nsys_names_for_one_release():
    with pytest.warns(DeprecationWarning, match="labkit.measure.streams"):
        assert nsys.ToyStream is streams.ToyStream
    with pytest.warns(DeprecationWarning, match="labkit.measure.streams"):
        assert nsys.async_timing_demo is streams.async_timing_demo


def test_plot_timeline_draws_every_row(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    tl = nsys.read_sqlite(nsys.synthesize_report(tmp_path / "p.sqlite", steps=1, layers=1))
    ax = nsys.plot_timeline(tl, start_ms=0, span_ms=5)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "GPU stream 7" in labels and "GPU stream 20" in labels and any(lb.startswith("NVTX") for lb in labels)


def test_record_runs_nsys_profile_then_export(tmp_path, monkeypatch):
    """The GPU-only path, driven with a fake nsys: the two commands it runs, in order."""
    import shutil
    import subprocess

    calls = []
    monkeypatch.setattr(shutil, "which", lambda exe: "/opt/fake/nsys" if exe == "nsys" else None)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    db = nsys.record(tmp_path / "live", steps=3)
    assert db == tmp_path / "live.sqlite"
    assert calls[0][:4] == ["/opt/fake/nsys", "profile", "-t", "cuda,nvtx,osrt"] and "demo_training(3)" in calls[0][-1]
    assert calls[1][:4] == ["/opt/fake/nsys", "export", "--type", "sqlite"] and calls[1][-1].endswith("live.nsys-rep")
    monkeypatch.setattr(shutil, "which", lambda exe: None)
    with pytest.raises(RuntimeError, match="not on PATH"):
        nsys.record(tmp_path / "x")
