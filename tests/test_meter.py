"""labkit.measure.meter: the CUDA-event branch with a fake event class, the CPU branch, records and errors."""
from __future__ import annotations

import time

import pytest

from labkit.measure.meter import CudaEventClock, Meter, PerfCounterClock
from labkit.record import RunRecord


class FakeTimeline:
    """A pretend GPU stream: tests advance ``now`` (ms) as if kernels ran."""

    def __init__(self):
        self.now = 0.0
        self.syncs = 0
        self.events = 0


def fake_event_class(tl: FakeTimeline):
    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing, "the meter must ask for timing events"
            self.t = None
            self.done = False
            tl.events += 1

        def record(self, stream=None):
            self.t = tl.now

        def synchronize(self):
            tl.syncs += 1
            self.done = True

        def elapsed_time(self, end):
            # like CUDA: both events must have been recorded and the end event completed
            if self.t is None or end.t is None or not end.done:
                raise RuntimeError("event not ready")
            return end.t - self.t

    return FakeEvent


def run_steps(meter, tl, n, *, data=1.0, fwd=2.0, bwd=4.0, opt=1.0, tokens=None):
    for _ in range(n):
        with meter.step(tokens=tokens):
            with meter.phase("data"):
                tl.now += data
            with meter.phase("forward"):
                tl.now += fwd
            with meter.phase("backward"):
                tl.now += bwd
            with meter.phase("optimizer"):
                tl.now += opt


def test_cuda_branch_records_events_without_host_sync_per_step():
    tl = FakeTimeline()
    m = Meter(clock=CudaEventClock(fake_event_class(tl)), warmup_steps=2, tokens_per_step=1000,
              device="cuda:0-fake", max_pending=64)
    run_steps(m, tl, 12)
    assert tl.syncs == 0                       # nothing waited on the device during the loop
    assert tl.events == 10 * 10                # warm-up steps record nothing; 2 + 4 x 2 events per step
    assert m.n_steps == 10
    s = m.summary()                            # resolution happens here, lazily
    assert tl.syncs > 0
    assert s["step_time"].median == pytest.approx(8e-3)
    assert s["phases"]["backward"].median == pytest.approx(4e-3)
    assert s["phase_share"]["data"] == pytest.approx(1 / 8)
    assert s["tokens_per_s"] == pytest.approx(1000 / 8e-3)
    assert s["clock"] == "cuda_event"


def test_bounded_ring_resolves_oldest_steps_only():
    tl = FakeTimeline()
    m = Meter(clock=CudaEventClock(fake_event_class(tl)), warmup_steps=0, max_pending=4)
    run_steps(m, tl, 3)
    assert tl.syncs == 0 and len(m._pending) == 3
    run_steps(m, tl, 1)                        # the ring is full: the oldest half is resolved
    assert len(m._pending) == 2 and len(m._steps) == 2
    assert tl.syncs == 2 * 5                   # 2 steps x (step + 4 phases), each waits on its end event
    assert m.n_steps == 4
    assert len(m.step_times) == 4 and not m._pending


def test_cpu_branch_uses_perf_counter_and_excludes_warmup():
    m = Meter(device="cpu", warmup_steps=3)
    assert isinstance(m._clock, PerfCounterClock)
    for i in range(8):
        with m.step(tokens=10):
            with m.phase("forward"):
                time.sleep(0.02 if i < 3 else 0.002)   # slow warm-up steps must not count
    assert m.n_steps == 5
    st = m.summary()["step_time"]
    assert 0.0015 < st.median < 0.015 and st.n == 5


def test_mfu_hfu_and_record():
    tl = FakeTimeline()
    m = Meter(clock=CudaEventClock(fake_event_class(tl)), warmup_steps=1, tokens_per_step=800,
              flops_per_token=6e6, hardware_flops_per_token=8e6, peak_flops=1e12, n_devices=2,
              dtype="bfloat16", label="t", peak_source="catalogue:TEST")
    run_steps(m, tl, 6)                        # 8 ms per step -> 100k tok/s global
    s = m.summary()
    assert s["tokens_per_s"] == pytest.approx(1e5)
    assert s["mfu"] == pytest.approx(1e5 * 6e6 / 2e12)
    assert s["hfu"] == pytest.approx(1e5 * 8e6 / 2e12)
    rec = m.to_record(config={"model": "tiny"})
    assert isinstance(rec, RunRecord)
    assert rec.peak_source == "catalogue:TEST" and rec.dtype == "bf16" and rec.n_devices == 2
    assert rec.tokens_per_s_per_device == pytest.approx(5e4)
    assert rec.data_wait_share == pytest.approx(1 / 8) and rec.comm_wait_share is None
    assert set(rec.phases) == {"data", "forward", "backward", "optimizer"}
    assert "torch" in rec.versions and rec.config == {"model": "tiny"}
    assert RunRecord.from_json(rec.to_json()).mfu == pytest.approx(rec.mfu)
    line = m.log_line()
    assert "MFU 30.0%" in line and "HFU 40.0%" in line and "100,000 tok/s" in line


def test_impossible_mfu_is_reported_not_returned():
    tl = FakeTimeline()
    m = Meter(clock=CudaEventClock(fake_event_class(tl)), warmup_steps=0, tokens_per_step=10**6,
              flops_per_token=1e9, peak_flops=1e12)
    run_steps(m, tl, 3)
    s = m.summary()
    assert s["mfu"] is None and "> 100%" in s["mfu_error"]
    assert "MFU refused" in m.log_line()
    assert "mfu_error" in m.to_record().extra


def test_variable_tokens_per_step_use_real_counts():
    tl = FakeTimeline()
    m = Meter(clock=CudaEventClock(fake_event_class(tl)), warmup_steps=0)
    run_steps(m, tl, 1, tokens=100)
    run_steps(m, tl, 1, tokens=300)
    assert m.summary()["tokens_per_s"] == pytest.approx(400 / 16e-3)


def test_no_tokens_no_throughput_and_empty_summary():
    m = Meter(device="cpu", warmup_steps=1)
    assert m.summary()["step_time"] is None and "no measured steps" in m.log_line()
    for _ in range(3):
        with m.step():
            pass
    assert m.summary()["tokens_per_s"] is None


def test_failed_step_is_not_recorded_and_nesting_refused():
    m = Meter(device="cpu", warmup_steps=0)
    with pytest.raises(KeyError):
        with m.step():
            raise KeyError("boom")
    assert m.n_steps == 0
    with pytest.raises(RuntimeError, match="nested"):
        with m.step():
            with m.step():
                pass


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(warmup_steps=-1), "warmup_steps=-1"), (dict(n_devices=0), "n_devices=0"),
    (dict(peak_flops=0), "peak_flops=0"), (dict(tokens_per_step=-5), "tokens_per_step=-5"),
    (dict(dtype="fp13"), "dtype='fp13'"), (dict(max_pending=1), "max_pending=1"),
])
def test_bad_arguments_name_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Meter(device="cpu", **kwargs)


def test_bad_step_tokens_and_phase_name():
    m = Meter(device="cpu", warmup_steps=0)
    with pytest.raises(ValueError, match="tokens=0"):
        with m.step(tokens=0):
            pass
    with pytest.raises(ValueError, match="phase name"):
        m.phase("")
    with pytest.raises(ValueError, match="not a RunRecord field"):
        m.to_record(bogus=1)


@pytest.mark.gpu
def test_real_cuda_events_time_gpu_work():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    a = torch.randn(4096, 4096, device="cuda")
    m = Meter(device="cuda", warmup_steps=1)
    for _ in range(4):
        with m.step(tokens=1):
            with m.phase("forward"):
                a @ a
    s = m.summary()
    assert s["clock"] == "cuda_event" and s["step_time"].median > 1e-5
    assert s["phases"]["forward"].median <= s["step_time"].median * 1.01


def test_nvtx_ranges_wrap_each_step_and_phase():
    """ranges= opens a range per step and per phase, warm-up steps included, balanced (chapter 10)."""
    from labkit.measure.meter import Meter

    class FakeNvtx:
        def __init__(self):
            self.events = []

        def range_push(self, name):
            self.events.append(("push", name))

        def range_pop(self):
            self.events.append(("pop",))

    fake = FakeNvtx()
    m = Meter(device="cpu", warmup_steps=1, ranges=fake)
    for _ in range(2):
        with m.step():
            with m.phase("forward"):
                pass
    assert fake.events == [("push", "step 0"), ("push", "forward"), ("pop",), ("pop",),
                           ("push", "step 1"), ("push", "forward"), ("pop",), ("pop",)]
    assert m.n_steps == 1
    assert Meter(device="cpu", ranges="nvtx")._ranges is None     # no CUDA device: no NVTX
