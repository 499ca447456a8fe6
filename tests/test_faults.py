"""labkit.teaching.faults (lab 2's mystery runs): the seed picks a fault the record does not show, and each fault,
run live on 2 gloo ranks at the lab's FAST sizes, is named by diagnose's primary family (a straggler by
the stragglers table too). Asserts families and ranks, never timings. The live tests take ≈ 80 s on 2
loaded cores (slow)."""
from __future__ import annotations

import re

import pytest

from labkit.diagnose import FAMILIES
from labkit.record import RunRecord, Stat
from labkit.teaching import faults
from labkit.train import TrainConfig

FAST = dict(seq_len=32, micro_batch=4, steps=8, warmup_steps=2)      # the lab's FAST sizes


def test_every_seed_maps_to_a_fault_of_a_course_family_and_every_fault_is_reachable():
    """Practice seeds and a key's tickets each reach every fault; no public name maps a seed to its fault."""
    from labkit.teaching import tickets

    assert not {"fault_of", "seed_for", "mystery_config"} & (set(faults.__all__) | set(dir(faults)))
    key = "lab02-test-key-0123456789"
    assert {faults._graded_fault(tickets.issue(key, "lab02_profiler", s), key)[0].name for s in range(64)} == set(
        faults.FAULTS)
    with pytest.raises(ValueError, match="practice seed"):
        faults._graded_fault(3, key)
    seen = {faults._fault_of(s)[0].name for s in range(64)}
    assert seen == set(faults.FAULTS)
    assert all(f.family in FAMILIES for f in faults.FAULTS.values())
    assert faults._fault_of(11) == faults._fault_of(11)                      # reproducible: the grader's view
    for name in faults.FAULTS:
        s = faults._seed_for(name, start=5)
        assert s >= 5 and faults._fault_of(s)[0].name == name
    assert {faults._fault_of(s)[1] for s in range(64)} == {0, 1}           # either rank can be the straggler


def test_bad_seeds_and_faults_are_named():
    with pytest.raises(ValueError, match="seed=-1"):
        faults._fault_of(-1)
    with pytest.raises(ValueError, match="seed=1.5"):
        faults._fault_of(1.5)
    with pytest.raises(ValueError, match="fault='tiny_buckets' is not valid"):
        faults._seed_for("tiny_buckets")
    with pytest.raises(ValueError, match="nprocs=1"):
        faults.mystery_run(0, "/nonexistent", nprocs=1)
    with pytest.raises(ValueError, match="straggler_rank=-1"):
        TrainConfig(inject="straggler", straggler_rank=-1)
    with pytest.raises(ValueError, match="host_stall_s"):
        TrainConfig(inject="host", host_stall_s=-0.1)


def _record(cfg: TrainConfig) -> RunRecord:
    step = Stat(median=0.1, p10=0.1, p90=0.1, n=6)
    return RunRecord(label=cfg.label, step_time=step, config={**cfg.to_dict(), "data_slowdown_s_used": 0.01,
                                                             "host_stall_s_used": 0.1, "comm_pad_mb_used": 0.0})


def test_the_public_record_differs_between_faults_only_in_the_seed():
    shown = {}
    for name in faults.FAULTS:
        seed = faults._seed_for(name)
        cfg = faults._mystery_config(seed, **FAST).replace(profile_dir="/tmp/x")
        assert cfg.inject == faults.FAULTS[name].inject                       # the grader's view names it
        rec = faults.public_record(_record(cfg), seed)
        assert rec.config.pop("mystery_seed") == seed and rec.config.pop("seed") == seed
        shown[name] = rec.config
        text = repr(rec.config) + rec.summary()
        for secret in (name, cfg.inject, "slowdown", "stall", "straggler", "comm_pad", "inject"):
            # as a word of its own: a field every run has (comm_hook) is no clue, and the configs are equal below
            assert not re.search(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9]|_hook)", text), (name, secret)
    first = next(iter(shown.values()))
    assert all(c == first for c in shown.values())


def test_the_mystery_runs_repr_names_only_the_seed(tmp_path):
    seed = faults._seed_for("slow_loader")
    rec = faults.public_record(_record(faults._mystery_config(seed, **FAST)), seed)
    text = repr(faults.MysteryRun(seed, rec, tmp_path / "trace", ("rank0.json", "rank1.json")))
    assert f"seed={seed}" in text and "slow" not in text and "data" not in text and str(tmp_path) not in text


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_each_fault_is_named_by_diagnose_from_a_live_run(tmp_path, calibrated_peaks):
    """All four faults in one launch of 2 gloo ranks (process start is the slow part), then one
    mystery_run end to end (its public record and trace files)."""
    from labkit.diagnose import diagnose
    from labkit.trace import analyze
    from labkit.train import run_many

    names = sorted(faults.FAULTS)
    seeds = {n: faults._seed_for(n) for n in names}
    cfgs = [faults._mystery_config(seeds[n], **FAST).replace(profile_dir=str(tmp_path / n)) for n in names]
    recs = run_many(cfgs, 2, timeout_s=200)
    got, why = {}, {}
    for n, rec in zip(names, recs, strict=True):
        a = analyze(tmp_path / n)
        d = diagnose(rec, a)
        flagged = a.stragglers[a.stragglers["straggler"]]["rank"].tolist()
        got[n] = (d.primary, flagged)
        sizes = {k: rec.config.get(k) for k in ("host_stall_s_used", "host_stall_reps_used", "data_slowdown_s_used",
                                               "comm_pad_mb_used")}
        why[n] = f"{d.report()}\nsizes {sizes}\n{a.stragglers.to_string()}"
    # (the other faults can have a rank last more often than chance by a few ms: no assertion on them)
    assert got["straggler"][1] == [cfgs[names.index("straggler")].straggler_rank], why["straggler"]
    assert {n: p for n, (p, _) in got.items()} == {n: faults.FAULTS[n].family for n in names}, (got, why)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mystery_run_end_to_end_hides_its_fault(tmp_path, calibrated_peaks):
    seed = faults._seed_for("host_stall")
    run = faults.mystery_run(seed, tmp_path / "trace", **FAST)
    assert [p.rsplit("/", 1)[1] for p in run.trace_files] == ["rank0.json", "rank1.json"]
    cfg = run.record.config
    assert cfg["mystery_seed"] == seed and "inject" not in cfg and "host_stall_s_used" not in cfg
    assert run.record.step_time.n == FAST["steps"] - FAST["warmup_steps"]
    assert run.record.device["count"] == 2 and run.record.device["backend"] == "gloo"
    assert "host" not in repr(run) and "stall" not in repr(run)


# ---------------------------------------------------------------- lab 8's LoaderJob
def test_the_loader_job_draws_its_size_and_shows_none_of_it():
    """Practice seeds draw every size of LOADER_STEPS; a ticket draws through the instructor's key, which a keyed
    grader checks; the job's repr and public names tell no size, and bad seeds or non-loader options are refused
    (before any training)."""
    from labkit.teaching import tickets

    assert {faults._loader_steps(s) for s in range(40)} == set(faults.LOADER_STEPS)
    key = "lab08-test-key-0123456789"
    seats = [tickets.issue(key, "lab08_data_pipeline", s) for s in range(40)]
    assert {faults._graded_loader(t, key) for t in seats} == set(faults.LOADER_STEPS)
    with pytest.raises(ValueError, match="practice seed"):
        faults._graded_loader(3, key)
    with pytest.raises(ValueError, match="not issued"):
        faults._graded_loader(tickets.issue("another-key-0123456789", "lab08_data_pipeline", 3), key)
    job = faults.LoaderJob(seats[4], device="cpu")
    assert repr(job) == f"LoaderJob(seed={seats[4]!r}, tiny GPT, micro-batch 2 x 64 tokens)"
    assert {n for n in dir(job) if not n.startswith("_")} == {
        "seed", "model", "seq_len", "device", "micro_batch", "steps", "warmup_steps", "options", "run", "ab"}
    for bad in (-1, "4-notatag", 2.5):
        with pytest.raises(ValueError, match="seed"):
            faults.LoaderJob(bad)
    with pytest.raises(ValueError, match=r"\['micro_batch'\] are not the loader's"):
        job.run(micro_batch=4)
    with pytest.raises(ValueError, match=r"\['data_slowdown_s'\] are not the loader's"):
        job.ab({"data_slowdown_s": 0.0})
    with pytest.raises(ValueError, match="non-empty dict"):
        job.ab({})
    assert job._slow is None                           # refused before the clean step was measured


def test_the_loader_job_runs_slow_and_its_record_hides_the_size(tmp_path):
    """A real traced run of practice job 0: every batch waited at least the hidden per-sample sleep (a sleep is a
    lower bound, whatever the load), and neither the record's config nor its public options hold the size."""
    import torch

    from labkit.trace import analyze

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        job = faults.LoaderJob(0, steps=3, warmup_steps=1, device="cpu")
        rec = job.run(profile_dir=tmp_path / "mystery")
    finally:
        torch.set_num_threads(threads)
    assert job._slow > 0 and rec.config["loader_seed"] == 0 and rec.config["num_workers"] == 0
    assert not {"data_slowdown_s", "data_slowdown_s_used", "inject"} & (set(rec.config) | set(job.options()))
    assert rec.phases["data"].median >= 0.95 * job.micro_batch * job._slow
    assert len(analyze(tmp_path / "mystery").steps) == rec.step_time.n
    assert job.options(num_workers=4)["num_workers"] == 4 and job.options()["loader_seed"] == 0
