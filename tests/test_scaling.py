"""labkit.measure.scaling: speedup, efficiency, the overlap step model and the BERT-large rebuild (chapter 5)."""
import pytest

from labkit.measure import scaling


def test_speedup_and_efficiencies():
    assert scaling.speedup(360, 200) == pytest.approx(1.8)
    assert scaling.strong_efficiency(360, 200, 4) == pytest.approx(0.45)
    assert scaling.weak_efficiency(100, 125) == pytest.approx(0.8)
    assert scaling.throughput_efficiency(1000, 1800, 4) == pytest.approx(0.45)


def test_step_time_overlap_models():
    assert scaling.step_time(90, 65, 45, overlap=True) == pytest.approx(135)
    assert scaling.step_time(90, 65, 45, overlap=False) == pytest.approx(200)
    assert scaling.step_time(90, 65, 45, overlap=0.5) == pytest.approx(167.5)
    # comm longer than compute: overlap hides the compute, not the comm
    assert scaling.step_time(40, 100, 0, overlap=True) == pytest.approx(100)
    with pytest.raises(ValueError, match="overlap"):
        scaling.step_time(1, 1, overlap=1.5)
    with pytest.raises(ValueError, match="comm_s"):
        scaling.step_time(1, -1)


def test_bert_large_case_rebuilt():
    # 1 GPU 360 ms; 4 GPUs: 200 ms measured (1.8x), 135 ms with full overlap
    parts = scaling.decompose(360, 4, serial_step_s=360 / 1.8, overlapped_step_s=135)
    assert parts.compute_s == pytest.approx(90)
    assert parts.comm_s == pytest.approx(65)
    assert parts.sync_s == pytest.approx(45)
    assert parts.step(False) == pytest.approx(200) and parts.step(True) == pytest.approx(135)
    assert parts.exposed_comm(False) == pytest.approx(65) and parts.exposed_comm(True) == pytest.approx(0)
    assert 360 / parts.step(True) == pytest.approx(2.667, abs=1e-3)


def test_decompose_rejects_impossible_cases():
    with pytest.raises(ValueError, match="cannot exceed"):
        scaling.decompose(360, 4, 100, 150)
    with pytest.raises(ValueError, match="overlap can hide at most"):
        scaling.decompose(360, 4, 300, 100)
    with pytest.raises(ValueError, match="n=0 is not valid: use an int >= 1"):
        scaling.decompose(360, 0, 300, 100)


def test_amdahl_and_gustafson():
    assert scaling.amdahl_speedup(0.0, 8) == pytest.approx(8)
    assert scaling.amdahl_speedup(0.1, 8) == pytest.approx(1 / (0.1 + 0.9 / 8))
    assert scaling.gustafson_speedup(0.1, 8) == pytest.approx(8 - 0.7)
    with pytest.raises(ValueError, match="serial_fraction"):
        scaling.amdahl_speedup(1.5, 2)


def test_scaling_table():
    t = scaling.scaling_table({1: 1000.0, 2: 1500.0, 4: 2000.0})
    assert list(t["speedup"]) == pytest.approx([1, 1.5, 2])
    assert list(t["efficiency"]) == pytest.approx([1, 0.75, 0.5])
    with pytest.raises(ValueError, match="1-device baseline"):
        scaling.scaling_table({2: 1.0})
    with pytest.raises(ValueError, match="mode"):
        scaling.scaling_table({1: 1.0}, mode="diagonal")


def test_measure_scaling_rejects_bad_requests():
    # validation happens before any rank starts: a stand-in config is enough
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Cfg:
        micro_batch: int = 3

    base = Cfg()
    with pytest.raises(ValueError, match="divisible"):
        scaling.measure_scaling(base, (1, 2), mode="strong")
    with pytest.raises(ValueError, match="must include 1"):
        scaling.measure_scaling(base, (2,), mode="weak")
    with pytest.raises(ValueError, match="mode"):
        scaling.measure_scaling(base, (1,), mode="both")


@pytest.mark.slow   # two launches of real gloo ranks: ≈ 10 s idle, > 20 s on a busy 2-core machine
def test_measure_scaling_on_gloo_ranks():
    from labkit import train

    base = train.TrainConfig(micro_batch=2, steps=3, warmup_steps=1, device="cpu")
    table, records = scaling.measure_scaling(base, (1, 2), mode="strong", timeout_s=120)
    assert list(table["devices"]) == [1, 2]
    assert records[1].n_devices == 1 and records[2].n_devices == 2
    assert records[2].config["parallel"] == "ddp" and records[2].config["micro_batch"] == 1
    assert table["global batch (tokens)"].nunique() == 1  # strong: the same global batch
    assert table["efficiency"].iloc[0] == pytest.approx(1.0)
    assert (table["tokens/s"] > 0).all()
