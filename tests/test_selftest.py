"""``labkit selftest --gpu`` without a GPU: a fake device backend drives every check, the runner, the report
and the CLI; the real CUDA backend's thin methods run against a faked ``torch.cuda``; the CPU rehearsal
runs the checks' real paths (the meter, the peak sweep, one FSDP2 launch on gloo ranks)."""
from __future__ import annotations

import json
import time

import pytest

from labkit.cli import main
from labkit.hardware.measure import PeakMeasurement
from labkit.record import RunRecord, Stat
from labkit.selftest import (
    CHECKS,
    PLANS,
    Check,
    CudaBackend,
    Failed,
    RehearsalBackend,
    Skip,
    run_checks,
    to_markdown,
    write_report,
)
from labkit.selftest.gpu import predicted_peak_bytes

NAMES = [c.name for c in CHECKS]


class FakeGpu(CudaBackend):
    """An asynchronous "GPU" in real time: work is queued (the host returns at once), events are stamped
    when the queue reaches them, synchronize() waits for the queue. Training and launches are faked."""

    def __init__(self, n=2, *, name="NVIDIA H200", matmul_s=0.002, events_at_host_time=False, memory_factor=1.1,
                 peak_tflops=700.0, mfu=0.4, fail=None, losses=(8.3, 8.0, 7.6)):
        self.n, self.name, self.matmul_s = n, name, matmul_s
        self.events_at_host_time, self.memory_factor = events_at_host_time, memory_factor
        self.peak_tflops, self.mfu, self.fail, self.losses = peak_tflops, mfu, fail or {}, list(losses)
        self.gpu_free = 0.0
        self.runs, self.launches, self.released = [], [], 0

    def unavailable(self):
        return None

    def device_count(self):
        return self.n

    def device_name(self, index=0):
        return self.name

    def versions(self):
        return {"python": "3.11", "torch": "2.13.0+cu128", "cuda": "12.8", "nccl": "2.27.3"}

    def synchronize(self):
        while time.perf_counter() < self.gpu_free:
            time.sleep(self.gpu_free - time.perf_counter())

    def event_cls(self):
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self, stream=None):
                now = time.perf_counter()
                self.t = now if gpu.events_at_host_time else max(now, gpu.gpu_free)

            def synchronize(self):
                gpu.synchronize()

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3
        return Event

    def matmul_workload(self, n, repeats):
        def work():
            self.gpu_free = max(self.gpu_free, time.perf_counter()) + repeats * self.matmul_s
        return work, 2.0 * n ** 3 * repeats

    def release(self):
        self.released += 1

    def _maybe_fail(self, key):
        if key in self.fail:
            raise self.fail[key]

    def train_run(self, cfg, nprocs, *, timeout_s):
        self.runs.append((cfg, nprocs, timeout_s))
        self._maybe_fail(cfg.parallel)
        pred = predicted_peak_bytes(cfg.model, cfg.micro_batch, cfg.compute_dtype)["total"]
        return RunRecord(label=cfg.label, step_time=Stat(median=0.1, p10=0.09, p90=0.11, n=5), tokens_per_s=1e5,
                         n_devices=nprocs, peak_flops=989e12, peak_source="catalogue:H200-SXM", dtype="bf16",
                         mfu=self.mfu, loss=self.losses, peak_memory_bytes=int(pred * self.memory_factor),
                         device={"name": self.name, "kind": "cuda", "backend": "nccl", "count": nprocs},
                         extra={"n_params": 1_011_000_000, "peak_memory_kind": "cuda.max_memory_allocated"})

    def launch(self, target, nprocs, *, args, timeout_s):
        self.launches.append((target, nprocs, args, timeout_s))
        self._maybe_fail("launch")
        sizes, iters = args
        raw = [{"op": op, "size": s, "count": s // 4, "type": "float", "redop": "sum", "root": -1,
                "times_s": [s / 100e9] * iters, "nranks": nprocs, "backend": "nccl"}
               for op in ("all_reduce", "all_gather", "reduce_scatter") for s in sizes]
        values = [{"rank": r, "world": nprocs, "backend": "nccl", "exact_sum": True, "raw": raw} for r in range(nprocs)]
        return type("Launch", (), {"values": values, "wall_s": 3.0})()

    def measure_peak(self, dtype, *, max_seconds, sizes=None):
        self._maybe_fail("peak")
        return PeakMeasurement(flops=self.peak_tflops * 1e12, shape=(8192, 8192, 8192), dtype=dtype, device="cuda:0",
                               table=[], seconds=1.0)


def _by_name(report):
    return {c["name"]: c for c in report["checks"]}


# ------------------------------------------------------------------------------------------ the runner
def test_every_check_runs_and_passes_on_a_healthy_fake_gpu():
    gpu = FakeGpu(n=2)
    report = run_checks(gpu)
    assert [c["name"] for c in report["checks"]] == NAMES
    assert report["summary"] == {"passed": 7, "failed": 0, "skipped": 0}, report["checks"]
    assert report["device"] == "NVIDIA H200" and report["recorded_by"] == "labkit selftest --gpu"
    assert report["versions"]["nccl"] == "2.27.3" and report["n_devices"] == 2
    c = _by_name(report)
    assert c["meter_cuda_events"]["figures"]["events_over_wall"] == pytest.approx(1.0, abs=0.1)
    assert c["meter_cuda_events"]["figures"]["host_launch_share"] < 0.5
    assert c["matmul_peak"]["figures"]["catalogue"] == "H200-SXM"
    assert c["matmul_peak"]["figures"]["fraction_of_catalogue"] == pytest.approx(700 / 989.4, rel=0.01)
    assert c["nccl_collectives"]["figures"]["all_reduce_busbw_GBps"] > 0
    assert all(r["seconds"] >= 0 and r["budget_s"] > 0 for r in report["checks"])
    assert sum(ch.budget_s for ch in CHECKS) <= 480           # the whole run fits 8 minutes
    assert gpu.released == len(CHECKS)
    # what ran: DDP and FSDP2 on every GPU in bf16, the memory run alone, MFU of the ~1B model
    runs = {cfg.label: (cfg, n) for cfg, n, _ in gpu.runs}
    assert runs["selftest:ddp"][0].parallel == "ddp" and runs["selftest:ddp"][1] == 2
    assert runs["selftest:ddp"][0].dtype == "bf16"
    assert runs["selftest:fsdp"][0].mp_policy == "bf16" and runs["selftest:fsdp"][0].compute_dtype == "bf16"
    assert runs["selftest:mfu"][0].model == "1b" and runs["selftest:mfu"][1] == 1
    assert c["mfu_reference"]["figures"]["mfu"] == 0.4 and "note" not in c["mfu_reference"]["figures"]
    (target, n, _, timeout), = gpu.launches
    assert n == 2 and timeout == c["nccl_collectives"]["budget_s"]


def test_one_gpu_skips_the_nccl_launch_with_a_reason_and_notes_single_rank_training():
    report = run_checks(FakeGpu(n=1))
    c = _by_name(report)
    assert c["nccl_collectives"]["status"] == "skipped"
    assert "one GPU" in c["nccl_collectives"]["reason"]
    assert c["ddp_train"]["status"] == "passed" and "one GPU" in c["ddp_train"]["figures"]["note"]
    assert report["summary"] == {"passed": 6, "failed": 0, "skipped": 1}


def test_a_broken_path_is_reported_with_its_error_and_the_others_still_run():
    gpu = FakeGpu(fail={"fsdp": RuntimeError("NCCL error: unhandled cuda error"), "peak": ValueError("boom")})
    report = run_checks(gpu)
    c = _by_name(report)
    assert c["fsdp2_train"]["status"] == "failed"
    assert "RuntimeError: NCCL error: unhandled cuda error" in c["fsdp2_train"]["error"]
    assert c["matmul_peak"]["status"] == "failed" and "ValueError: boom" in c["matmul_peak"]["error"]
    for name in ("meter_cuda_events", "nccl_collectives", "ddp_train", "memory_model", "mfu_reference"):
        assert c[name]["status"] == "passed", c[name]
    assert report["summary"]["failed"] == 2


@pytest.mark.parametrize("kw,name,words", [
    ({"events_at_host_time": True}, "meter_cuda_events", "events/wall"),    # chapter 7: timing the launch
    ({"memory_factor": 3.0}, "memory_model", "measured/predicted"),
    ({"peak_tflops": 200.0}, "matmul_peak", "measured/catalogue"),
    ({"mfu": 0.05}, "mfu_reference", "below 20%"),
    ({"losses": (8.0, 8.2, float("nan"))}, "ddp_train", "not all finite"),
    ({"losses": (8.0, 8.1, 8.2)}, "ddp_train", "did not fall"),
])
def test_a_number_outside_its_band_fails_that_check_with_its_figures(kw, name, words):
    c = _by_name(run_checks(FakeGpu(**kw)))[name]
    assert c["status"] == "failed" and words in c["reason"] and c["figures"], c
    assert c["error"] is None


def test_an_uncatalogued_gpu_skips_the_peak_comparison_but_keeps_the_measurement():
    c = _by_name(run_checks(FakeGpu(name="NVIDIA Mystery X1")))["matmul_peak"]
    assert c["status"] == "skipped" and "not in labkit's catalogue" in c["reason"]
    assert c["figures"]["measured_tflops"] == 700.0


def _timed_check(name, budget, takes, clock):
    def fn(backend, plan, budget_s):
        clock.t += takes
        return {"took": takes}
    return Check(name, f"{name} check", "7", budget, budget / 2, fn)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_check_that_would_pass_the_total_budget_is_skipped_not_started():
    clock = FakeClock()
    ran = []
    slow = _timed_check("slow", 300, 350, clock)          # overruns its own budget
    late = Check("late", "late check", "4", 200, 100, lambda b, p, s: ran.append(1) or {})
    small = _timed_check("small", 100, 10, clock)         # still fits after the overrun
    report = run_checks(FakeGpu(), checks_to_run=[slow, late, small], total_budget_s=480, clock=clock)
    c = _by_name(report)
    assert c["slow"]["status"] == "passed" and "against a budget of 300 s" in c["slow"]["reason"]
    assert c["late"]["status"] == "skipped" and "not started" in c["late"]["reason"] and not ran
    assert "350 s spent + its budget 200 s would pass the total budget of 480 s" in c["late"]["reason"]
    assert c["small"]["status"] == "passed"
    assert report["wall_s"] == 360


def test_quick_halves_the_budgets_and_uses_the_quick_plan():
    gpu = FakeGpu()
    report = run_checks(gpu, quick=True)
    assert report["quick"] is True and report["plan"]["mfu_model"] == PLANS["quick"]["mfu_model"]
    assert [c["budget_s"] for c in report["checks"]] == [ch.quick_budget_s for ch in CHECKS]
    assert "not the ~1B reference" in _by_name(report)["mfu_reference"]["figures"]["note"]


def test_runner_refuses_a_backend_without_a_device_and_bad_arguments():
    class NoGpu(FakeGpu):
        def unavailable(self):
            return "no CUDA GPU found: test"
    with pytest.raises(ValueError, match="no CUDA GPU found: test"):
        run_checks(NoGpu())
    with pytest.raises(ValueError, match="total_budget_s"):
        run_checks(FakeGpu(), total_budget_s=0)
    with pytest.raises(ValueError, match="unique"):
        run_checks(FakeGpu(), checks_to_run=[CHECKS[0], CHECKS[0]])


def test_skip_and_failed_carry_their_figures():
    def skipper(b, p, s):
        raise Skip("not here", {"a": 1})

    def failer(b, p, s):
        raise Failed("too low", {"b": 2})
    report = run_checks(FakeGpu(), checks_to_run=[Check("s", "s", "7", 1, 1, skipper), Check("f", "f", "7", 1, 1, failer)])
    c = _by_name(report)
    assert (c["s"]["status"], c["s"]["figures"]) == ("skipped", {"a": 1})
    assert (c["f"]["status"], c["f"]["figures"], c["f"]["reason"]) == ("failed", {"b": 2}, "too low")


# ------------------------------------------------------------------------------------------ the report
def test_report_files_are_written_atomically_and_never_overwritten(tmp_path):
    report = run_checks(FakeGpu(), checks_to_run=CHECKS[:1])
    js1, md1 = write_report(report, tmp_path / "r")
    first = js1.read_bytes()
    js2, md2 = write_report(report, tmp_path / "r")           # same device, same second
    assert js2 != js1 and md2 != md1 and js2.stem == js1.stem + "-2"
    assert js1.read_bytes() == first
    (tmp_path / "r" / (js1.stem + "-3.md")).write_text("someone else's")   # a name taken by half a pair
    js3, _ = write_report(report, tmp_path / "r")
    assert js3.stem == js1.stem + "-4"
    assert (tmp_path / "r" / (js1.stem + "-3.md")).read_text() == "someone else's"
    assert not list((tmp_path / "r").glob(".selftest-*")), "a temporary file was left behind"
    doc = json.loads(js1.read_text())
    assert doc["kind"] == "labkit.selftest" and doc["checks"][0]["name"] == "meter_cuda_events"
    f = tmp_path / "taken"
    f.write_text("x")
    with pytest.raises(ValueError, match=f"--out {f} is a file"):
        write_report(report, f)


def test_markdown_says_who_recorded_it_on_what_and_when():
    report = run_checks(FakeGpu(fail={"ddp": RuntimeError("rank 1 died")}))
    md = to_markdown(report)
    assert md.startswith("# labkit GPU self-check: NVIDIA H200\n")
    assert f"Recorded by `labkit selftest --gpu` on **NVIDIA H200** (× 2) at {report['date']}." in md
    assert "torch 2.13.0+cu128" in md and "nccl 2.27.3" in md
    assert "| `ddp_train` | FAIL |" in md and "RuntimeError: rank 1 died" in md
    assert md.count("| PASS |") == 6


# ------------------------------------------------------------------------------------------ the CLI
def test_cli_refuses_without_a_gpu_with_a_clear_message(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["selftest", "--gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("labkit selftest: error: no CUDA GPU found")
    assert "--dry-run" in err[0]
    assert main(["selftest"]) == 2
    assert "say --gpu" in capsys.readouterr().err


def test_cli_dry_run_lists_the_checks_and_budgets_on_cpu(capsys):
    assert main(["selftest", "--gpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for c in CHECKS:
        assert c.name in out and f"{c.budget_s:5.0f} s" in out
    assert "total budget 480 s" in out
    assert main(["selftest", "--gpu", "--dry-run", "--quick", "--only", "ddp_train, mfu_reference"]) == 0
    out = capsys.readouterr().out
    assert "2 checks" in out and "ddp_train" in out and "meter_cuda_events" not in out


@pytest.mark.parametrize("argv,words", [
    (["--only", "nope"], "check 'nope' is not known"),
    (["--only", ","], "names no check"),
    (["--budget", "-5"], "--budget=-5.0 is not valid"),
])
def test_cli_bad_arguments_exit_2_naming_them(argv, words, capsys):
    assert main(["selftest", "--gpu", "--dry-run", *argv]) == 2
    assert words in capsys.readouterr().err


def test_cli_on_a_fake_gpu_writes_a_new_report_each_run(monkeypatch, tmp_path, capsys):
    import labkit.selftest.backend as be

    monkeypatch.setattr(be, "CudaBackend", lambda: FakeGpu(n=1))
    out = tmp_path / "reports"
    assert main(["selftest", "--gpu", "--out", str(out), "--only", "meter_cuda_events,nccl_collectives"]) == 0
    text = capsys.readouterr().out
    assert "[pass] meter_cuda_events" in text and "[skip] nccl_collectives" in text and "report: " in text
    assert main(["selftest", "--gpu", "--out", str(out), "--only", "meter_cuda_events"]) == 0
    assert len(list(out.glob("*.json"))) == 2 and len(list(out.glob("*.md"))) == 2
    monkeypatch.setattr(be, "CudaBackend", lambda: FakeGpu(fail={"ddp": RuntimeError("x")}))
    assert main(["selftest", "--gpu", "--out", str(out), "--only", "ddp_train"]) == 1
    assert "[FAIL] ddp_train" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the thin CUDA layer
def test_cuda_backend_is_a_thin_layer_over_torch_cuda(monkeypatch):
    import torch

    class Ev:
        pass
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: f"NVIDIA H200 #{i}")
    monkeypatch.setattr(torch.cuda, "Event", Ev)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    b = CudaBackend()
    assert b.unavailable() is None and b.device_count() == 4 and b.device_name(2) == "NVIDIA H200 #2"
    assert b.event_cls() is Ev
    b.synchronize()
    assert calls == ["sync"] and b.plan(False) == PLANS["full"] and b.plan(True) == PLANS["quick"]


@pytest.mark.parametrize("cuda_build,words", [(None, "CPU-only build"), ("12.8", "check nvidia-smi")])
def test_cuda_backend_says_why_there_is_no_gpu(monkeypatch, cuda_build, words):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    assert words in CudaBackend().unavailable()


# ------------------------------------------------------------------------------------------ CPU rehearsal
def test_rehearsal_runs_the_meter_and_peak_paths_for_real_on_cpu():
    by = {c.name: c for c in CHECKS}
    report = run_checks(RehearsalBackend(2), checks_to_run=[by["meter_cuda_events"], by["matmul_peak"]])
    c = _by_name(report)
    assert c["meter_cuda_events"]["status"] == "passed", c["meter_cuda_events"]
    assert c["meter_cuda_events"]["figures"]["events_over_wall"] == pytest.approx(1.0, abs=0.1)
    assert c["matmul_peak"]["status"] == "skipped" and c["matmul_peak"]["figures"]["measured_tflops"] > 0
    assert "rehearsal" in report["recorded_by"]


def test_rehearsal_trains_fsdp2_on_two_gloo_ranks_through_the_real_loop():
    by = {c.name: c for c in CHECKS}
    c = _by_name(run_checks(RehearsalBackend(2), checks_to_run=[by["fsdp2_train"]]))["fsdp2_train"]
    assert c["status"] == "passed", c
    assert c["figures"]["backend"] == "gloo" and c["figures"]["nranks"] == 2
    assert c["figures"]["loss_last"] < c["figures"]["loss_first"]
