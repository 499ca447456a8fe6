"""labkit.hardware: catalogue values, safe device-name matching, peak resolution, measurements."""
from __future__ import annotations

import json

import pytest

from labkit import hardware as hw
from labkit.hardware import calibration as cal_mod
from labkit.hardware import catalogue, measure
from labkit.hardware import peak as peak_mod

# Real torch.cuda.get_device_name() strings -> the part they are. Sources: the strings printed by
# nvidia-smi / torch on those parts (e.g. nanoGPT and torchtitan issue logs, vendor docs).
REAL_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA H200 NVL", "H200-NVL"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("Tesla V100-PCIE-32GB", "V100-PCIe-32GB"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GH200 480GB", "GH200-96GB"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X VF", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI350X", "MI350X"),
    ("AMD Instinct MI355X", "MI355X"),
    ("AMD Instinct MI250X/MI250", "MI250X-GCD"),
    ("AMD Instinct MI250X", "MI250X-GCD"),
    # nvidia-smi's name column on those cards (e.g. gist.github.com/bigsnarfdude/1eb47ee4959eee5b1217c893ba91e4bf;
    # the "Model" column of huggingface.co/datasets/ohdoking/gpu_spec)
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
]


@pytest.mark.parametrize(("name", "part"), REAL_NAMES)
def test_real_device_names_match_exactly_one_part(name, part):
    assert hw.lookup(name).name == part


def test_no_part_is_mistaken_for_a_neighbour():
    # issue #2: torchtitan's substring match gave an A100 job H100-NVL's peak and an MI350X 152% MFU
    assert hw.lookup("AMD Instinct MI350X").name != "MI300X"
    assert hw.lookup("NVIDIA H200 NVL").peak("bf16") < hw.lookup("NVIDIA H200").peak("bf16")
    assert hw.lookup("NVIDIA A100-SXM4-80GB").peak("bf16") == 312e12
    peaks = {hw.lookup(n).name for n, _ in REAL_NAMES}
    assert len(peaks) == len({p for _, p in REAL_NAMES})


@pytest.mark.parametrize("name", ["NVIDIA H100", "A100", "NVIDIA H10", "NVIDIA GH200", "NVIDIA L40",
                                  "NVIDIA H800", "AMD Instinct MI308X", "Radeon RX 7900"])
def test_ambiguous_or_unknown_names_raise_listing_known_parts(name):
    with pytest.raises(ValueError) as e:
        hw.lookup(name)
    assert "Known parts" in str(e.value) and "H100-SXM" in str(e.value)


def test_every_alias_resolves_to_its_own_part_and_extra_words_are_refused():
    for spec in hw.CATALOGUE.values():
        for alias in (spec.name, *spec.aliases):
            assert hw.lookup(alias) is spec
            assert hw.lookup(alias.upper().replace(" ", "_")) is spec     # case and separators ignored
    # no substring matching: an unexpected extra word is not silently dropped
    with pytest.raises(ValueError, match="near candidates"):
        hw.lookup("NVIDIA A100-SXM4-40GB MAXQ")


def test_ambiguous_name_lists_its_candidates():
    with pytest.raises(ValueError, match="H100-NVL.*H100-PCIe.*H100-SXM"):
        hw.lookup("NVIDIA H100")


def test_catalogue_refuses_an_alias_claimed_twice():
    a = hw.DeviceSpec("X1", "v", {"bf16": 1.0}, 1, 1.0, "src", aliases=("Foo X",))
    b = hw.DeviceSpec("X2", "v", {"bf16": 1.0}, 1, 1.0, "src", aliases=("foo-x",))
    with pytest.raises(ValueError, match="ambiguous alias"):
        catalogue._build_catalogue([a, b])


def test_required_parts_present_with_sources_and_dense_peaks():
    need = ["V100-SXM2-32GB", "A100-SXM-40GB", "A100-SXM-80GB", "A100-PCIe-40GB", "A100-PCIe-80GB", "A10G",
            "L4", "L40S", "H100-SXM", "H100-PCIe", "H100-NVL", "H200-SXM", "H200-NVL", "B200",
            "MI250X-OAM", "MI300X"]
    for n in need:
        spec = hw.CATALOGUE[n]
        assert "http" in spec.source, n
        assert spec.memory_bytes > 0 and spec.memory_bw > 0
        assert set(spec.peak_flops) <= set(hw.PEAK_KEYS)      # the dtypes, fp64_tensor, *_sparse
        assert "fp32" in spec.peak_flops
    # dense values from the datasheets (sparse figures halved):
    assert hw.lookup("H100-SXM").peak("bf16") == pytest.approx(989.5e12)   # 1979* with sparsity
    assert hw.lookup("H100-SXM").peak("fp8") == pytest.approx(1979e12)     # 3958*
    assert hw.lookup("A100-SXM-40GB").peak("tf32") == pytest.approx(156e12)
    assert hw.lookup("MI300X").peak("bf16") == pytest.approx(1307.4e12)
    assert hw.lookup("L40S").memory_bw == pytest.approx(864e9)
    assert hw.lookup("H200-SXM").memory_bw == pytest.approx(4.8e12)
    # one MI250X GCD (one torch device) is half the module
    assert hw.lookup("MI250X-GCD").peak("bf16") * 2 == pytest.approx(hw.lookup("MI250X-OAM").peak("bf16"))


def test_new_parts_with_their_datasheet_figures():
    gb200, h20, a6000 = hw.lookup("NVIDIA GB200"), hw.lookup("NVIDIA H20"), hw.lookup("NVIDIA RTX A6000")
    assert gb200.peak("bf16") == pytest.approx(2500e12) and gb200.peak("bf16_sparse") == pytest.approx(5000e12)
    assert gb200.peak("fp8") == pytest.approx(5000e12) and gb200.peak("fp64") == pytest.approx(45e12)
    assert gb200.memory_bw == pytest.approx(8e12) and "gb200-nvl72" in gb200.source
    assert h20.peak("bf16") == pytest.approx(148e12) and h20.memory_bw == pytest.approx(4e12)
    assert "no public H20 datasheet" in h20.source and "fp8" not in h20.peak_flops     # not found: left out
    assert a6000.peak("fp16") == pytest.approx(154.8e12) and a6000.peak("fp32") == pytest.approx(38.7e12)
    assert a6000.memory_bw == pytest.approx(768e9) and "tf32" not in a6000.peak_flops
    assert hw.lookup("NVIDIA L40S").peak("bf16_sparse") == pytest.approx(724e12)
    assert hw.lookup("RTX 6000 Ada").peak("fp32") == pytest.approx(91.1e12)
    for part in ("GB200", "H20", "RTX-A6000", "RTX-6000-Ada", "L40S"):
        assert "http" in hw.CATALOGUE[part].source


def test_each_key_is_documented_tensor_fp64_split_and_dense_is_the_default():
    doc = catalogue.__doc__
    for key in ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "<dtype>_sparse"):
        assert f"``{key}``" in doc, key
    assert "**dense**" in doc and "**vector**" in doc
    for spec in hw.CATALOGUE.values():
        assert set(spec.peak_flops) <= set(hw.PEAK_KEYS), spec.name
        for d in ("tf32", "bf16", "fp16", "fp8", "int8"):       # a sparse figure is twice its dense one
            if f"{d}_sparse" in spec.peak_flops:
                assert spec.peak_flops[f"{d}_sparse"] == 2 * spec.peak(d)
    a100, h100 = hw.lookup("A100-SXM-80GB"), hw.lookup("H100-SXM")
    assert (a100.peak("fp64"), a100.peak("fp64_tensor")) == (9.7e12, 19.5e12)      # vector vs tensor core
    assert (h100.peak("fp64"), h100.peak("fp64_tensor")) == (34e12, 67e12)
    assert h100.peak("bf16") == h100.peak("torch.bfloat16") == 989.5e12            # dense for a dtype
    assert h100.peak("BF16_SPARSE") == 1979e12
    assert hw.lookup("MI300X").peak("fp64_tensor") == pytest.approx(163.4e12) and "fp64" not in \
        hw.lookup("MI300X").peak_flops                                           # vector figure not catalogued


def test_family_names_answer_when_all_parts_agree():
    assert hw.lookup_peak("A100", "bf16") == 312e12
    assert hw.lookup_peak("A100", "fp64") == 9.7e12
    assert hw.lookup_peak("V100 SXM2", "fp16") == 125e12
    assert hw.lookup_peak("NVIDIA GH200", "bf16") == 989.5e12
    assert hw.family("A100").names == ["A100-SXM-40GB", "A100-SXM-80GB", "A100-PCIe-40GB", "A100-PCIe-80GB"]
    assert hw.family("NVIDIA H100 80GB HBM3").names == ["H100-SXM"]                 # an exact name: one part
    assert hw.lookup_peak("H100-SXM", "fp8") == 1979e12


def test_family_names_that_disagree_list_each_part_with_its_figure():
    with pytest.raises(ValueError, match=r"name='H100'.*H100-SXM 989.5 TFLOP/s.*H100-PCIe 756.5.*H100-NVL 835.5"):
        hw.lookup_peak("H100", "bf16")
    with pytest.raises(ValueError, match=r"V100-SXM2-16GB 7.8 TFLOP/s.*V100-PCIe-16GB 7 TFLOP/s"):
        hw.lookup_peak("V100", "fp64")
    with pytest.raises(ValueError, match=r"A100-SXM-40GB \(none\)"):                # no part has it
        hw.lookup_peak("A100", "fp8")
    with pytest.raises(ValueError, match="names a family of 4 parts.*lookup_peak"):
        hw.lookup("A100")                      # one part is needed for memory and bandwidth
    with pytest.raises(ValueError, match="Known parts"):
        hw.lookup_peak("NVIDIA H800", "bf16")
    with pytest.raises(ValueError, match="name"):
        hw.lookup_peak(3, "bf16")
    with pytest.raises(ValueError, match="name"):
        hw.family("NVIDIA")                    # vendor words only: names no part
    with pytest.raises(ValueError, match="dtype='bf17'"):
        hw.lookup_peak("A100", "bf17")


def test_peak_for_missing_dtype_names_the_dtypes_it_has():
    with pytest.raises(ValueError, match=r"dtype='bf16'.*V100.*\['fp16', 'fp32', 'fp64'\]"):
        hw.lookup("Tesla V100-SXM2-16GB").peak("bf16")
    with pytest.raises(ValueError, match="dtype='float13'"):
        hw.lookup("H100-SXM").peak("float13")


def test_normalize_dtype_accepts_torch_dtypes():
    import torch

    assert hw.normalize_dtype(torch.bfloat16) == "bf16"
    assert hw.normalize_dtype("float32") == "fp32"


def test_resolve_peak_order_user_catalogue_measured():
    assert hw.resolve_peak("H100-SXM", "bf16", peak_flops=5e12) == (5e12, "user")
    assert hw.resolve_peak("NVIDIA H100 80GB HBM3", "bf16") == (989.5e12, "catalogue:H100-SXM")
    peak, src = hw.resolve_peak("cpu", "fp32")
    assert src.startswith("measured:matmul") and src.endswith("run `labkit calibrate`)") and peak > 1e6
    assert hw.resolve_peak("cpu", "fp32") == (peak, src)          # cached per process
    with pytest.raises(ValueError, match="peak_flops"):
        hw.resolve_peak("cpu", "fp32", peak_flops=0)
    # a family name answers when all its parts agree, and lists them with their figures when not
    assert hw.resolve_peak("A100", "bf16") == (312e12, "catalogue:A100 = A100-SXM-40GB|A100-SXM-80GB|"
                                                       "A100-PCIe-40GB|A100-PCIe-80GB")
    with pytest.raises(ValueError, match="H100-SXM 989.5 TFLOP/s, H100-PCIe 756.5 TFLOP/s, H100-NVL 835.5"):
        hw.resolve_peak("NVIDIA H100", "bf16")


def test_measure_matmul_peak_cpu_is_real_and_time_boxed():
    m = hw.measure_matmul_peak("cpu", "fp32", sizes=[(64, 64, 64), (128, 128, 128), (4096, 4096, 4096)],
                               max_seconds=0.01, repeats=3)
    # the time box never starts the 4096^3 shape (~137 GFLOP, seconds on a CPU)
    assert [s for s, _ in m.table][:1] == [(64, 64, 64)] and (4096, 4096, 4096) not in dict(m.table)
    assert m.seconds < 2.0
    assert m.flops > 1e5   # loose: CI cores are shared
    assert m.describe().startswith("matmul ") and m.describe().endswith(" fp32 on cpu")


def test_measure_bad_inputs():
    with pytest.raises(ValueError, match="max_seconds"):
        hw.measure_matmul_peak("cpu", max_seconds=0)
    with pytest.raises(ValueError, match="sizes"):
        hw.measure_matmul_peak("cpu", sizes=[(0, 4, 4)])
    with pytest.raises(ValueError, match="fp8"):
        hw.measure_matmul_peak("cpu", "fp8")
    with pytest.raises(ValueError, match="nbytes"):
        hw.measure_memory_bandwidth("cpu", nbytes=10)
    with pytest.raises(ValueError, match="device"):
        hw.resolve_device("tpu-ish")


def test_measure_memory_bandwidth_cpu():
    bw = hw.measure_memory_bandwidth("cpu", nbytes=8 * 2**20, repeats=3)
    assert 1e6 < bw < 1e13


def test_time_fn_cpu_takes_warmup_and_repeats():
    calls = []
    times = hw.time_fn(lambda: calls.append(1), "cpu", warmup=2, repeats=4, inner=3)
    assert len(times) == 4 and len(calls) == 2 + 4 * 3 and all(t >= 0 for t in times)


def test_ridge_point():
    s = hw.lookup("A100-SXM-80GB")
    assert s.ridge_point("bf16") == pytest.approx(312e12 / 2039e9)


@pytest.mark.gpu
def test_gpu_peak_is_below_catalogue():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    m = hw.measure_matmul_peak("cuda", "bf16", max_seconds=5)
    peak, src = hw.resolve_peak("cuda", "bf16")
    if src.startswith("catalogue"):
        assert 0.3 < m.flops / peak < 1.0


def test_remeasure_keeps_the_better_peak(monkeypatch):
    """A peak measured on a loaded machine comes out low; remeasure_peak raises the cached value."""
    rates = iter([1e9, 5e9])

    def fake(device, dtype, **kw):
        return hw.PeakMeasurement(flops=next(rates), shape=(8, 8, 8), dtype=dtype, device=str(device),
                                  table=[], seconds=0.0)

    monkeypatch.setattr(peak_mod, "measure_matmul_peak", fake)     # resolve_peak's module, not the face
    monkeypatch.setattr(peak_mod, "_MEASURED", {})
    assert hw.resolve_peak("cpu", "fp32")[0] == 1e9
    assert hw.remeasure_peak("cpu", "fp32").flops == 5e9
    assert hw.resolve_peak("cpu", "fp32")[0] == 5e9       # later resolutions use the better figure


# ------------------------------------------------------------------------------ calibration
def _fake_measure(rates):
    """measure_matmul_peak stand-in: returns the next FLOP/s of ``rates`` per dtype."""
    it = {d: iter(v) for d, v in rates.items()}

    def fake(device, dtype, **kw):
        d = hw.normalize_dtype(dtype)
        return hw.PeakMeasurement(flops=next(it[d]), shape=(512, 512, 512), dtype=d, device=str(device),
                                  table=[], seconds=0.0)
    return fake


def test_calibration_is_stored_with_its_conditions_and_wins_over_a_live_measurement(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [1e9, 3e9, 2.8e9]}))
    monkeypatch.setattr(measure, "measure_memory_bandwidth", lambda dev, **kw: 5e9)
    c = cal_mod.calibrate_one("cpu", "fp32", threads=1, rounds=3)
    assert c.flops == 3e9 and c.rounds == [1e9, 3e9, 2.8e9]        # the best round, confirmed by another
    assert c.conditions["threads"] == 1 and c.conditions["torch"]
    assert (tmp_path / "calibration.json").exists()
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    peak, src = hw.resolve_peak("cpu", "fp32")
    assert peak == 3e9 and src.startswith("calibrated:matmul 512x512@512x512 fp32 on cpu")
    # another thread count has no calibration: measured in-process, and it says so
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(peak_mod, "measure_matmul_peak", _fake_measure({"fp32": [7e8]}))
    monkeypatch.setattr(peak_mod, "_MEASURED", {})
    assert hw.resolve_peak("cpu", "fp32") == (7e8, "measured:matmul 512x512@512x512 fp32 on cpu"
                                                   + peak_mod.NOT_CALIBRATED)


def test_a_calibration_whose_conditions_changed_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measure, "measure_memory_bandwidth", lambda dev, **kw: 5e9)
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [1e9, 1e9, 4e9, 3.9e9, 3.8e9]}))
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    cal_mod.calibrate_one("cpu", "fp32", rounds=1)
    assert cal_mod.find("cpu", "fp32") [1] is True
    monkeypatch.setattr(torch, "__version__", "9.9.9")            # torch upgraded since
    cal, fresh = cal_mod.find("cpu", "fp32")
    assert cal.flops == 1e9 and fresh is False
    peak, src = hw.resolve_peak("cpu", "fp32")
    assert peak == 4e9 and src.startswith("calibrated:")         # re-calibrated under the new conditions
    assert cal_mod.find("cpu", "fp32") == (cal_mod.find("cpu", "fp32")[0], True)


def test_capability_says_whether_bf16_is_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LABKIT_ASSUME_SLOW_BF16", raising=False)
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [100e9] * 3, "bf16": [400e9, 1e9],
                                                                       "fp16": [60e9]}))
    cap = cal_mod.capability("cpu", ("bf16", "fp16"))
    assert cap["bf16"]["verdict"] == "fast" and cap["bf16"]["ratio_to_fp32"] == 4.0
    assert cap["fp16"]["verdict"] == "no faster"
    cap = cal_mod.capability("cpu", ("bf16",))                    # the AMD EPYC case: emulated bf16
    assert cap["bf16"]["verdict"] == "slow" and cap["bf16"]["ratio_to_fp32"] == 0.01
    monkeypatch.setenv("LABKIT_ASSUME_SLOW_BF16", "1")
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [100e9], "bf16": [400e9]}))
    cap = cal_mod.capability("cpu", ("bf16",))
    assert cap["bf16"]["verdict"] == "slow" and "LABKIT_ASSUME_SLOW_BF16" in cap["bf16"]["source"]


def test_calibrate_bad_inputs_and_a_corrupt_file(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="rounds"):
        cal_mod.calibrate_one("cpu", "fp32", rounds=0)
    (tmp_path / "calibration.json").write_text("{not json")
    with pytest.raises(ValueError, match="calibration.json.*labkit calibrate"):
        cal_mod.find("cpu", "fp32")


def test_calibrate_cli_stores_and_shows_then_keeps_fresh_entries(monkeypatch, tmp_path, capsys):
    from labkit.cli import main

    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measure, "measure_memory_bandwidth", lambda dev, **kw: 5e9)
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [2.9e9, 3e9], "bf16": [1.9e8, 2e8]}))
    assert main(["calibrate", "--device", "cpu", "--threads", "1", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "3.0 GFLOP/s" in out and "0.07× fp32" in out and "calibration.json" in out
    # a second run with --if-missing measures nothing (the fake has no more rates to give)
    assert main(["calibrate", "--device", "cpu", "--threads", "1", "--if-missing"]) == 0
    assert main(["calibrate", "--show"]) == 0
    assert "cpu|1|fp32: 3.0 GFLOP/s" in capsys.readouterr().out


def test_an_unstable_peak_is_measured_longer_then_refused_and_not_stored(monkeypatch, tmp_path, capsys):
    """Issue #34: a calibration stored 'rounds within 82 %' on a loaded machine. A best round no other round
    reproduces within 10 % is measured longer (more rounds, twice the time box) and, still alone, refused."""
    from labkit.cli import main

    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measure, "measure_memory_bandwidth", lambda dev, **kw: 5e9)
    boxes = []
    fake = _fake_measure({"fp32": [100e9, 82e9, 60e9, 70e9, 75e9, 80e9, 79e9, 81e9, 78e9]})
    monkeypatch.setattr(measure, "measure_matmul_peak", lambda dev, d, **kw: boxes.append(kw["max_seconds"]) or
                        fake(dev, d, **kw))
    with pytest.raises(cal_mod.UnstableCalibration, match=r"spread 40%.*not stored"):
        cal_mod.calibrate_one("cpu", "fp32", threads=1, rounds=3, max_seconds=1.0)
    assert boxes == [1.0] * 3 + [2.0] * 6 and not (tmp_path / "calibration.json").exists()
    # a disturbed round, then a confirming one: stored after 4 rounds, its spread said
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [100e9, 60e9, 50e9, 95e9]}))
    c = cal_mod.calibrate_one("cpu", "fp32", threads=1, rounds=3)
    assert c.flops == 100e9 and len(c.rounds) == 4 and cal_mod.spread(c.rounds) == pytest.approx(0.5)
    # the CLI refuses with the reason and exit 1, storing nothing new
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [100e9, 50e9, 40e9, 30e9, 45e9,
                                                                                35e9]}))
    assert main(["calibrate", "--device", "cpu", "--threads", "2", "--dtype", "fp32", "--rounds", "2"]) == 1
    assert "unstable" in capsys.readouterr().err
    assert "cpu|2|fp32" not in json.loads((tmp_path / "calibration.json").read_text())


def test_fewer_threads_beating_more_is_measured_again_then_refused(monkeypatch, tmp_path):
    """A 1-thread bf16 peak above the 2-thread one is a disturbed 2-thread run: measured again once; still
    below, nothing is stored (not even the consistent entries of the same sitting)."""
    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measure, "measure_memory_bandwidth", lambda dev, **kw: 5e9)
    monkeypatch.setattr(measure, "measure_matmul_peak",
                        _fake_measure({"bf16": [50e9, 49e9, 48e9, 60e9, 59e9, 58e9, 51e9, 50e9, 50e9]}))
    with pytest.raises(cal_mod.UnstableCalibration, match=r"1 thread\(s\) reached 60.0 GFLOP/s, 2 threads only 51.0"):
        cal_mod.calibrate("cpu", ("bf16",), threads=[2, 1], rounds=3)
    assert not (tmp_path / "calibration.json").exists()
    monkeypatch.setattr(measure, "measure_matmul_peak",     # the second look finds the 2-thread peak: stored
                        _fake_measure({"bf16": [50e9, 49e9, 48e9, 60e9, 59e9, 58e9, 110e9, 108e9, 100e9]}))
    out = {c.conditions["threads"]: c.flops for c in cal_mod.calibrate("cpu", ("bf16",), threads=[2, 1], rounds=3)}
    assert out == {2: 110e9, 1: 60e9}
    stored = json.loads((tmp_path / "calibration.json").read_text())
    assert stored["cpu|2|bf16"]["flops"] == 110e9 and stored["cpu|1|bf16"]["flops"] == 60e9


# ------------------------------------------------------------------------------ bandwidth beside the roof
def _fake_sysfs(root, caches):
    """cpu0/cache/index<i>/{level,type,size} as Linux writes them."""
    for i, (level, kind, size) in enumerate(caches):
        d = root / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return str(root)


def test_last_level_cache_is_the_highest_data_level(tmp_path):
    caches = [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "98304K")]
    assert hw.last_level_cache_bytes(_fake_sysfs(tmp_path / "a", caches)) == 96 * 2**20
    assert hw.last_level_cache_bytes(_fake_sysfs(tmp_path / "b", [(2, "Unified", "2M")])) == 2 * 2**20
    # no sysfs (macOS, a container), or a size it cannot read: 0, and the copy keeps its 64 MiB floor
    assert hw.last_level_cache_bytes(str(tmp_path / "absent")) == 0
    assert hw.last_level_cache_bytes(_fake_sysfs(tmp_path / "c", [(3, "Unified", "lots")])) == 0


def test_the_copy_is_sized_beyond_a_large_l3(monkeypatch):
    """STREAM's rule: each array at least 4x the last-level cache. A 64 MiB copy inside a 96 MiB L3
    timed the cache (several x the memory bandwidth) and put the roofline's ridge below every shape."""
    import torch

    seen = []
    real_ones = torch.ones
    monkeypatch.setattr(measure, "last_level_cache_bytes", lambda *a: 96 * 2**20)
    monkeypatch.setattr(measure, "time_fn", lambda fn, dev, **kw: [1.0])
    monkeypatch.setattr(torch, "ones", lambda n, **kw: seen.append(n) or real_ones(1, **kw))
    hw.measure_memory_bandwidth("cpu")
    assert seen == [4 * 96 * 2**20 // 4]           # float32 elements of a 384 MiB array
    monkeypatch.setattr(measure, "last_level_cache_bytes", lambda *a: 0)
    hw.measure_memory_bandwidth("cpu")
    assert seen[-1] == 64 * 2**20 // 4


def test_resolve_bandwidth_catalogue_calibrated_measured(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("LABKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(peak_mod, "measure_memory_bandwidth", lambda dev: 7e9)
    assert hw.resolve_bandwidth("cpu", "fp32") == (7e9, "measured:copy on cpu" + peak_mod.NOT_CALIBRATED)
    monkeypatch.setattr(measure, "measure_matmul_peak", _fake_measure({"fp32": [3e9, 3e9]}))
    monkeypatch.setattr(measure, "measure_memory_bandwidth", lambda dev, **kw: 5e9)
    cal_mod.calibrate_one("cpu", "fp32", threads=1, rounds=1)
    bw, src = hw.resolve_bandwidth("cpu", "fp32")
    assert bw == 5e9 and src.startswith("calibrated:copy beside matmul 512x512@512x512 fp32 on cpu")
    # the peak and the bandwidth of one calibration: one ridge point, one set of conditions
    assert hw.resolve_peak("cpu", "fp32")[0] / bw == pytest.approx(0.6)
    with pytest.raises(ValueError, match="int3.*is not known"):
        hw.resolve_bandwidth("cpu", "int3")


def test_resolve_bandwidth_reads_the_catalogue_on_a_known_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(peak_mod, "resolve_device", lambda d: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H100 80GB HBM3")
    assert hw.resolve_bandwidth("cuda", "bf16") == (hw.lookup("H100-SXM").memory_bw, "catalogue:H100-SXM")
