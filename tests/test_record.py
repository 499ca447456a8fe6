"""labkit.record: a RunRecord validates on construction, assignment and load, names the file and the
field, and round-trips; Stat and atomic_write_text refuse garbage (chapter 14). Includes the seeded fuzz
test of every public function of the module with the bad-value classes of tests/_bad_values.py."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from _bad_values import SCALARS, expect_refused, is_finite_real, value

from labkit import paths
from labkit.checks import ArgumentTypeError
from labkit.record import RunRecord, Stat, atomic_write_text


def _good(**kw):
    base = dict(label="r", step_time=Stat.of([0.1, 0.11, 0.12]), tokens_per_step=1024, tokens_per_s=9000.0,
                n_devices=2, model_flops_per_token=6e6, hardware_flops_per_token=8e6, peak_flops=1e12,
                mfu=0.3, hfu=0.4, utilisation=0.9, phases={"data": Stat.of([0.0, 0.001, 0.0])},
                comm_wait_share=0.2, data_wait_share=0.05, peak_memory_bytes=2**30, loss=[8.3, float("nan")])
    base.update(kw)
    return RunRecord(**base)


# ----------------------------------------------------------------------------- the examples
@pytest.mark.parametrize("field, bad", [
    ("mfu", -0.5), ("mfu", 5.0), ("mfu", math.nan), ("mfu", math.inf), ("hfu", 1.2), ("utilisation", -0.1),
    ("comm_wait_share", 1.5), ("data_wait_share", -0.2), ("n_devices", -2), ("n_devices", 0), ("n_devices", 2.0),
    ("tokens_per_s", -1.0), ("tokens_per_s", 0.0), ("peak_flops", math.inf), ("tokens_per_step", 0),
    ("peak_memory_bytes", -1), ("label", None), ("mfu", "0.5"), ("mfu", True), ("config", None), ("loss", "8.3")])
def test_bad_figures_are_refused_on_construction_assignment_and_load(tmp_path, field, bad):
    with pytest.raises(ValueError, match=field):
        RunRecord(**{field: bad})
    rec = _good()
    with pytest.raises(ValueError, match=field):
        setattr(rec, field, bad)
    doc = _good().to_dict()
    doc[field] = bad
    f = tmp_path / "rec.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=field) as e:
        RunRecord.load(f)
    assert str(f) in str(e.value)


def test_negative_step_times_and_bad_stats_from_json_name_file_and_field(tmp_path):
    doc = _good().to_dict()
    doc["step_time"] = {"median": -0.1, "p10": -0.2, "p90": 0.1, "n": 3}
    f = tmp_path / "neg.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"neg\.json.*step_time\.median=-0\.1"):
        RunRecord.load(f)
    doc["step_time"] = {"median": 0.1, "p10": 0.2, "p90": 0.3, "n": 3}        # p10 above the median
    f.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="p10 <= median <= p90"):
        RunRecord.load(f)
    doc["step_time"] = {"median": 0.1, "p10": 0.1, "p90": 0.1}                # no n
    f.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"step_time is not a valid Stat: missing \['n'\]"):
        RunRecord.load(f)
    doc["step_time"] = None
    doc["phases"] = {"data": {"median": 0.0, "p10": 0.0, "p90": 0.0, "n": 0}}
    f.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"phases\['data'\]\.n=0"):
        RunRecord.load(f)
    f.write_text('{"mfu": NaN}')
    with pytest.raises(ValueError, match=r"mfu=nan"):
        RunRecord.load(f)
    f.write_text("{")
    with pytest.raises(ValueError, match="neg.json is not a valid run record"):
        RunRecord.load(f)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RunRecord.load(tmp_path / "missing.json")


def test_figures_that_must_agree():
    with pytest.raises(ValueError, match="hardware_flops_per_token"):
        RunRecord(model_flops_per_token=8e6, hardware_flops_per_token=6e6)
    with pytest.raises(ValueError, match="comm_wait_share=0.7 \\+ data_wait_share=0.5"):
        RunRecord(comm_wait_share=0.7, data_wait_share=0.5)
    rec = RunRecord(comm_wait_share=0.5, data_wait_share=0.4)
    rec.data_wait_share = 0.6        # each field alone is valid; validate() (run before every save) sees the pair
    with pytest.raises(ValueError, match="data_wait_share=0.6 > 1|comm_wait_share=0.5 \\+ data_wait_share=0.6"):
        rec.validate()
    with pytest.raises(ValueError, match="data_wait_share"):
        rec.to_json()
    # hand-edited MFU above HFU still loads: graders judge forged records with their own checks (lab 1)
    assert RunRecord.from_json(RunRecord(mfu=0.5, hfu=0.2).to_json()).mfu == 0.5


def test_in_place_edits_are_caught_before_save(tmp_path):
    rec = _good()
    rec.phases["forward"] = {"median": -1.0, "p10": 0.0, "p90": 0.0, "n": 1}
    with pytest.raises(ValueError, match=r"phases\['forward'\]\.median=-1\.0"):
        rec.save(tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
    rec = _good()
    rec.step_time.median = -0.5
    with pytest.raises(ValueError, match=r"step_time\.median=-0\.5"):
        rec.validate()


def test_float_noise_at_the_edges_is_clamped_not_refused():
    rec = RunRecord(mfu=1 + 1e-12, hfu=1.0, comm_wait_share=-1e-13, utilisation=1 + 5e-10)
    assert (rec.mfu, rec.comm_wait_share, rec.utilisation) == (1.0, 0.0, 1.0)


def test_valid_records_round_trip_and_none_stays_unknown(tmp_path):
    rec = _good(extra={"step_times": [0.1, 0.11]}, config={"anything": [1, "x"]})
    back = RunRecord.load(rec.save(tmp_path / "r.json"))
    assert (back.mfu, back.hfu, back.n_devices, back.peak_memory_bytes) == (0.3, 0.4, 2, 2**30)
    assert back.step_time == rec.step_time and back.phases == rec.phases and math.isnan(back.loss[1])
    empty = RunRecord()
    assert empty.mfu is None and empty.step_time is None and RunRecord.from_json(empty.to_json()) == empty
    shipped = RunRecord.load(paths.dataset("traces", "cpu_gloo_ddp_tiny.record.json"))
    assert 0 < shipped.mfu <= 1 and shipped.step_time.n == 4
    r = RunRecord(mfu=np.float32(0.25), n_devices=np.int64(4), tokens_per_step=np.int32(8))
    assert type(r.mfu) is float and type(r.n_devices) is int and json.loads(r.to_json())["n_devices"] == 4


def test_from_dict_keeps_unknown_keys_without_touching_the_input():
    d = {"label": "x", "extra": {"a": 1}, "future_field": 3, "tokens_per_s_per_device": 5}
    rec = RunRecord.from_dict(d)
    assert rec.extra == {"a": 1, "future_field": 3} and d["extra"] == {"a": 1}
    with pytest.raises(ValueError, match="newer than this labkit"):
        RunRecord.from_dict({"schema": 99, "mfu": "whatever"})
    with pytest.raises(ArgumentTypeError, match="needs a dict"):
        RunRecord.from_dict([1, 2])


def test_stat_of_and_spread():
    s = Stat.of([1.7e308, 1.6e308])                       # no overflow in the mean or the median
    assert math.isfinite(s.median) and math.isfinite(s.mean) and s.p10 <= s.median <= s.p90
    with pytest.raises(ValueError, match=r"values\[1\]=-1"):
        Stat.of([1.0, -1.0])
    with pytest.raises(ValueError, match="at least 1"):
        Stat.of([])
    assert Stat.of([0.0, 0.0]).spread == 0.0
    with pytest.raises(ValueError, match="spread is undefined"):
        _ = Stat(median=0.0, p10=0.0, p90=1.0, n=3).spread


def test_atomic_write_text_exclusive(tmp_path):
    f = tmp_path / "a.txt"
    atomic_write_text(f, "one", exclusive=True)
    with pytest.raises(FileExistsError, match="already exists"):
        atomic_write_text(f, "two", exclusive=True)
    assert f.read_text() == "one"
    atomic_write_text(f, "three")
    assert f.read_text() == "three" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    with pytest.raises(ValueError, match="path=''"):
        atomic_write_text("", "x")


# ----------------------------------------------------------------------------- fuzz
VALID = {   # which classes of tests/_bad_values.py each kind of field accepts (every other class is refused)
    "share_opt": {"none", "zero", "tiny", "np_float"},
    "positive_opt": {"none", "tiny", "above_one", "huge_float", "np_float"},
    "nonneg": {"zero", "tiny", "above_one", "huge_float", "np_float"},
    "count": set(),
    "count_opt": {"none"},
    "bytes_opt": {"none", "zero", "tiny", "above_one", "huge_float", "np_float"},
    "text": {"text", "numeric_text"},
    "text_opt": {"none", "text", "numeric_text"},
    "mapping": {"dict"},
    "loss": {"list"},
    "schema": set(),
    "stat_opt": {"none"},
    "phases": set(),
}
FIELDS = {"label": "text", "step_time": "stat_opt", "tokens_per_step": "count_opt", "tokens_per_s": "positive_opt",
          "n_devices": "count", "model_flops_per_token": "positive_opt", "hardware_flops_per_token": "positive_opt",
          "peak_flops": "positive_opt", "peak_source": "text_opt", "dtype": "text_opt", "mfu": "share_opt",
          "hfu": "share_opt", "utilisation": "share_opt", "phases": "phases", "comm_wait_share": "share_opt",
          "data_wait_share": "share_opt", "peak_memory_bytes": "bytes_opt", "loss": "loss", "config": "mapping",
          "device": "mapping", "versions": "mapping", "extra": "mapping", "schema": "schema"}


def _sane(rec: RunRecord) -> None:
    """An accepted record holds no NaN/inf/negative figure and survives a JSON round trip."""
    for k, v in rec.to_dict().items():
        if k in FIELDS and FIELDS[k] not in ("text", "text_opt", "mapping", "loss") and v is not None \
                and isinstance(v, (int, float)):
            assert math.isfinite(float(v)) and v >= 0, (k, v)
    assert RunRecord.from_json(rec.to_json()).label == rec.label
    rec.summary()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fuzz_every_record_function_with_bad_values(tmp_path, seed):
    rng = random.Random(seed)
    assert set(FIELDS) == {f for f in RunRecord.__dataclass_fields__}      # every field is fuzzed
    for field, kind in FIELDS.items():
        for cls in SCALARS:
            v = value(cls, rng)
            calls = {"RunRecord()": lambda f=field, v=v: RunRecord(**{f: v}),
                     "from_dict": lambda f=field, v=v: RunRecord.from_dict({f: v}),
                     "setattr": lambda f=field, v=v: setattr(RunRecord(), f, v)}
            for how, fn in calls.items():
                what = f"{how} {field}={v!r:.60} ({cls})"
                if cls in VALID[kind]:
                    out = fn()
                    if isinstance(out, RunRecord):
                        _sane(out)
                else:
                    expect_refused(fn, field, what)
    # Stat: each field alone, the others fixed so that any finite value >= 0 keeps p10 <= median <= p90
    big = 1.7e308
    stat_calls = {"median": lambda v: Stat(median=v, p10=0.0, p90=big, n=3),
                  "p10": lambda v: Stat(median=big, p10=v, p90=big, n=3),
                  "p90": lambda v: Stat(median=0.0, p10=0.0, p90=v, n=3),
                  "n": lambda v: Stat(median=1.0, p10=1.0, p90=1.0, n=v),
                  "mean": lambda v: Stat(median=1.0, p10=1.0, p90=1.0, n=1, mean=v)}
    for field, make in stat_calls.items():
        kind = {"n": "count", "mean": "nonneg"}.get(field, "nonneg")
        for cls in SCALARS:
            v = value(cls, rng)
            ok = cls in VALID[kind] or (field == "mean" and cls == "none")
            if ok:
                s = make(v)
                assert all(math.isfinite(x) for x in (s.median, s.p10, s.p90))
            else:
                expect_refused(lambda v=v, make=make: make(v), field, f"Stat {field}={v!r:.60} ({cls})")
    # nested: a bad entry inside step_time / phases / loss / a sequence: refused naming the path, or sane
    for cls in SCALARS:
        v = value(cls, rng)
        for key in ("median", "p10", "p90", "n", "mean"):
            st = {"median": 1.0, "p10": 0.5, "p90": 2.0, "n": 3, key: v}
            for field, make in (("step_time", lambda st=st: RunRecord(step_time=st)),
                                ("phases['x']", lambda st=st: RunRecord(phases={"x": st}))):
                try:
                    _sane(make())
                except ValueError as e:
                    assert f"{field}" in str(e), (field, key, v, str(e))
        seq = [0.1, 0.2, 0.3]
        i = rng.randrange(3)
        seq[i] = v
        if is_finite_real(v) and float(v) >= 0:
            assert math.isfinite(Stat.of(seq).median)
        else:
            expect_refused(lambda seq=seq: Stat.of(seq), f"values[{i}]", f"Stat.of {seq!r:.80}")
        if not (is_finite_real(v) or isinstance(v, (float, np.floating))):   # NaN/inf loss: a diverged run
            expect_refused(lambda seq=seq: RunRecord(loss=seq), f"loss[{i}]", f"loss {seq!r:.80}")
    # whole-argument types of the other public functions
    for cls in SCALARS:
        v = value(cls, rng)
        if cls != "dict":
            expect_refused(lambda v=v: RunRecord.from_dict(v), "from_dict", f"from_dict({v!r:.40})")
        if cls not in ("text", "numeric_text"):
            expect_refused(lambda v=v: RunRecord.from_json(v), "text", f"from_json({v!r:.40})")
            expect_refused(lambda v=v: RunRecord.load(v), "path", f"load({v!r:.40})")
            expect_refused(lambda v=v: RunRecord().save(v), "path", f"save({v!r:.40})")
            expect_refused(lambda v=v: atomic_write_text(tmp_path / "t", v), "text", f"text={v!r:.40}")
        else:
            expect_refused(lambda v=v: RunRecord.from_json(v), "text", f"from_json({v!r:.40})")
        if cls not in ("bool", "np_bool"):
            expect_refused(lambda v=v: atomic_write_text(tmp_path / "t", "x", exclusive=v), "exclusive",
                           f"exclusive={v!r:.40}")
    # environment_versions() takes no argument: nothing to fuzz (it imports torch; test_train covers it)


def test_fuzz_load_names_the_file_and_the_field(tmp_path):
    rng = random.Random(7)
    f = tmp_path / "fuzz.json"
    for field, kind in FIELDS.items():
        for cls in SCALARS:
            if cls in VALID[kind] or cls in ("object", "complex", "np_bool", "np_float"):   # not JSON
                continue
            v = value(cls, rng)
            f.write_text(json.dumps({"label": "x", field: v}, default=lambda o: o.item()))
            msg = expect_refused(lambda: RunRecord.load(f), field, f"load {field}={v!r:.60}")
            assert str(f) in msg, msg


# ---------------------------------------------------------------- where learners' files go
def test_work_dir_falls_back_to_the_users_own_folder_when_the_course_is_read_only(tmp_path, monkeypatch):
    """On a hub the course checkout is shared and read-only: traces and lab evidence go to the user's folder."""
    from labkit import paths

    monkeypatch.delenv("LABKIT_WORK", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert paths.work_dir("x") == paths.repo_root() / "build" / "work" / "x"      # writable checkout
    monkeypatch.setattr(paths, "_writable", lambda folder: False)                  # read-only checkout
    got = paths.work_dir("evidence", "lab01")
    assert got == tmp_path / "data" / "labkit" / "work" / "evidence" / "lab01" and got.is_dir()
    monkeypatch.setenv("LABKIT_WORK", str(tmp_path / "mine"))                      # the override still wins
    assert paths.work_dir() == tmp_path / "mine"
