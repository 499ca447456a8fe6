"""labkit.memory.timeline: allocated bytes through one live training step, and the figure drawn from it."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

import labkit  # noqa: E402
from labkit import memory
from labkit.teaching import viz  # noqa: E402


def _first_step(micro_batch, seq_len):
    cfg = labkit.model.gpt.gpt_config("tiny", seq_len=seq_len)
    torch.manual_seed(0)
    model = labkit.model.gpt.GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, cfg.vocab_size, (micro_batch, seq_len))
    activations = memory.measure_activation_bytes(model, idx, idx)
    rec = memory.StepMemoryRecorder(model, opt)
    with rec:
        with rec.phase("forward"):
            loss = model(idx, idx)[1]
        with rec.phase("backward"):
            loss.backward()
        with rec.phase("optimizer"):
            opt.step()
    return rec.result, memory.measure_model_state(model, opt), activations


@pytest.fixture(scope="module")
def step():
    return _first_step(8, 64)       # 512 tokens: the saved activations outweigh Adam's states


def test_baseline_is_the_parameters_of_a_fresh_model(step):
    st, held, _ = step
    assert st.baseline == held.params and st.samples["allocated"].iloc[0] == held.params


def test_each_phase_leaves_behind_what_the_anatomy_says(step):
    st, held, activations = step
    assert abs(st.change("forward") / activations - 1) < 0.01          # saved activations (+ the loss)
    after_backward = st.phases.set_index("phase").loc["backward", "end_bytes"]
    assert abs((after_backward - st.baseline) / held.grads - 1) < 0.001  # activations freed, gradients kept
    assert abs(st.change("optimizer") / held.optimizer - 1) < 0.001      # Adam's moments, allocated once


def test_peak_comes_in_backward_when_activations_dominate_and_in_the_step_when_they_do_not(step):
    st, _, _ = step
    assert st.peak_phase == "backward"
    small, _, _ = _first_step(1, 16)     # a few tokens: the model states (+ Adam's temporaries) set the peak
    assert small.peak_phase == "optimizer"
    assert st.peak_bytes > st.phases.set_index("phase").loc["forward", "end_bytes"]
    assert list(st.phases["phase"]) == list(memory.timeline.PHASES)
    assert (st.phases["end_ms"] >= st.phases["start_ms"]).all()


def test_change_refuses_an_unknown_phase(step):
    with pytest.raises(ValueError, match="forward"):
        step[0].change("warmup")


def test_recorder_refuses_phases_out_of_place_and_a_step_without_them():
    model = labkit.model.gpt.GPT(labkit.model.gpt.gpt_config("tiny", seq_len=16))
    rec = memory.StepMemoryRecorder(model)
    with pytest.raises(RuntimeError, match="inside"):
        rec.phase("forward")
    with pytest.raises(ValueError, match="once"):
        with rec:
            with rec.phase("forward"):
                pass
            rec.phase("forward")
    with pytest.raises(ValueError, match="backward"):
        with memory.StepMemoryRecorder(model) as r2:
            with r2.phase("forward"):
                pass
    with pytest.raises(ValueError, match="tpu"):
        memory.StepMemoryRecorder(model, device="tpu")


def test_memory_samples_reads_one_device_type():
    trace = {"traceEvents": [
        {"name": "[memory]", "ts": 2.0, "args": {"Total Allocated": 300, "Bytes": -100, "Device Type": 0}},
        {"name": "[memory]", "ts": 1.0, "args": {"Total Allocated": 400, "Bytes": 400, "Device Type": 0}},
        {"name": "[memory]", "ts": 1.5, "args": {"Total Allocated": 9, "Bytes": 9, "Device Type": 1}},
        {"name": "aten::mm", "ts": 1.2, "dur": 3.0}]}
    cpu = memory.memory_samples(trace, "cpu")
    assert list(cpu["allocated"]) == [400, 300] and list(cpu["ts_us"]) == [1.0, 2.0]
    assert list(memory.memory_samples(trace, "cuda")["allocated"]) == [9]
    with pytest.raises(ValueError, match="cuda"):
        memory.memory_samples(trace, "tpu")


def test_viz_draws_the_measured_curve_phases_and_references(step):
    st, held, _ = step
    refs = {"parameters": held.params, "+ gradients": held.params + held.grads}
    ax = viz.memory_timeline(st, refs, unit="MiB")
    curve = ax.lines[0]
    assert max(curve.get_ydata()) == pytest.approx(st.peak_bytes / 2**20)
    assert len(ax.patches) == len(st.phases) == 3                         # one shaded span per phase
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "parameters" in labels and "+ gradients" in labels and any(lab.startswith("peak") for lab in labels)
    assert [t.get_text() for t in ax.texts] == list(st.phases["phase"])
    with pytest.raises(ValueError, match="MiB"):
        viz.memory_timeline(st, unit="furlongs")
    import matplotlib.pyplot as plt

    plt.close("all")


def test_a_tensor_left_counted_by_an_earlier_profiler_does_not_shift_the_step():
    # c10 counts a block allocated under a profiler until it is freed under one: freed after, it stays in
    # "Total Allocated" for the rest of the process. The step is measured from the count at its start.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        left = torch.ones(1_000_000)
    del left
    st, held, _ = _first_step(2, 16)
    assert st.baseline == held.params and st.samples["allocated"].iloc[0] == held.params
