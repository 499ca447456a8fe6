"""lab12_capstone and labkit.teaching.capstone: the seed (a ticket, or a practice number) draws every family and a workload
shows none of it; a keyed grader accepts only the tickets its key issued; a fix may change trainer options only and
never the global batch (run and A/B refuse it); a memory budget fits more sequences under recomputation; and the
hidden checks, run by the grader's checker on evidence made here (a real traced run of the workload for q1), pass a
real fix and fail one that names the right family but does not speed the job up, a family the run's diagnosis does
not find or a justification citing no figure of the run, a fix without an A/B, one that "speeds it up" by changing
the global batch or the sequence length, a speed-up typed in, and an A/B arm altered by more than the A/B's own
run-to-run spread allows against its traced run (a genuine A/B on a loaded machine, whose traced runs stray as far,
passes).

Full marks for the instructor source, zero for the released copy and the forged speed-up (lab12_forged) are
graded through ``labkit grade`` in tests/test_grading_labs.py."""
from __future__ import annotations

import pytest

from labkit.record import RunRecord, Stat
from labkit.teaching import capstone
from labkit.teaching.grading import EvidenceBook, load_lab
from labkit.teaching.grading.checker import run_checks

LAB = "lab12_capstone"


def test_the_seed_draws_every_mystery_and_the_workload_shows_none():
    from labkit.diagnose import FAMILIES

    drawn = {capstone._mystery_of(s).name for s in range(30)}
    assert drawn == set(capstone.MYSTERIES)
    assert sorted(m.family for m in capstone.MYSTERIES.values()) == sorted(FAMILIES)    # one per family
    assert not {"mystery_of", "seed_for"} & set(dir(capstone)) and not any("mystery" in n for n in capstone.__all__
                                                                         if n not in ("MYSTERIES", "Mystery"))
    for name in capstone.MYSTERIES:
        seed = capstone._seed_for(name)
        assert capstone._mystery_of(seed).name == name
        w = capstone.Workload(seed)
        assert "seed=" in repr(w) and name not in repr(w)
        # nothing public tells the fault: no options, config, rank count or family before a run
        assert {n for n in dir(w) if not n.startswith("_")} == {"seed", "steps", "warmup_steps", "device", "run", "ab"}
        assert not {v for k, v in vars(w).items() if k != "_clean"} & {name, capstone.MYSTERIES[name]}
    w = capstone.Workload(capstone._seed_for("tiny_micro"))
    full = w._config().to_dict()
    assert full["micro_batch"] == 1 and full["accum"] == capstone.GLOBAL_BATCH
    assert not set(capstone.HIDDEN) & set(w._options())
    for bad in (-1, "7", "7-zz", 1.5):
        with pytest.raises(ValueError, match="seed"):
            capstone.Workload(bad)
    with pytest.raises(ValueError, match="name"):
        capstone._seed_for("straggler")


def test_tickets_draw_every_family_and_a_keyed_grader_takes_only_its_own():
    """A ticket is the seed and its HMAC tag under the instructor's key: the seats of one key draw every mystery;
    without the key a ticket cannot be made (another key's tag is refused) and a practice seed is refused."""
    from labkit.teaching import tickets

    key, other = "k" * 16 + "course-2026", "x" * 16 + "another-course"
    seats = [tickets.issue(key, LAB, s) for s in range(40)]
    assert {capstone._graded_mystery(t, key).name for t in seats} == set(capstone.MYSTERIES)
    assert tickets.verify(key, LAB, seats[7]) == 7 and tickets.parse(seats[7])[0] == 7
    assert seats[3] != tickets.issue(other, LAB, 3) != tickets.issue(key, "lab08_data_pipeline", 3)
    with pytest.raises(ValueError, match="not issued by this course's key"):
        capstone._graded_mystery(tickets.issue(other, LAB, 3), key)
    with pytest.raises(ValueError, match="practice seed"):
        capstone._graded_mystery(3, key)
    assert capstone._graded_mystery(3, None) == capstone._mystery_of(3)      # practice: no key, any seed
    with pytest.raises(ValueError, match="draws no hidden fault"):
        tickets.issue(key, "lab01_baseline", 1)
    with pytest.raises(ValueError, match="16 characters"):
        tickets.issue("short", LAB, 1)
    w = capstone.Workload(seats[5], steps=3, warmup_steps=1)
    assert w._config().seed == 5 and repr(w).startswith(f"Workload(seed={seats[5]!r}")


def test_release_writes_tickets_outside_the_release_and_grade_takes_the_key(tmp_path, capsys):
    """``labkit release LAB --key-file --tickets`` writes seat,seed,ticket rows to a new file outside --out (the
    released notebook holds neither the key nor a ticket); an existing tickets file is not overwritten; a file
    inside --out, a lab without a keyed fault or a short key is refused (exit 2)."""
    from labkit.cli import main
    from labkit.teaching import tickets

    keyf = tmp_path / "course.key"
    keyf.write_text("0123456789abcdef-secret\n")
    out, csv = tmp_path / "release", tmp_path / "private" / "tickets.csv"
    assert main(["release", LAB, "--out", str(out), "--key-file", str(keyf), "--tickets", str(csv), "--seats", "5"]) == 0
    rows = csv.read_text().splitlines()
    assert rows[0] == "seat,seed,ticket" and len(rows) == 6
    assert rows[3] == f"3,2,{tickets.issue('0123456789abcdef-secret', LAB, 2)}"
    released = (out / LAB / f"{LAB}.ipynb").read_text()
    assert "0123456789abcdef-secret" not in released and rows[3].split(",")[2] not in released
    before = csv.read_text()
    for argv, match in (([LAB, "--out", str(out), "--key-file", str(keyf), "--tickets", str(csv)], "not overwritten"),
                        ([LAB, "--out", str(out), "--key-file", str(keyf), "--tickets", str(out / "t.csv")],
                         "inside the released folder"),
                        (["lab01_baseline", "--out", str(out), "--key-file", str(keyf), "--tickets",
                          str(tmp_path / "t1.csv")], "draws no hidden fault"),
                        ([LAB, "--out", str(out), "--key-file", str(keyf)], "go together")):
        assert main(["release", *argv]) == 2
        assert match in capsys.readouterr().err
    assert csv.read_text() == before and not (out / "t.csv").exists()
    short = tmp_path / "short.key"
    short.write_text("abc")
    assert main(["grade", LAB, str(tmp_path / "none"), "--out", str(tmp_path / "g"), "--key-file", str(short)]) == 2
    assert "16 characters" in capsys.readouterr().err


def test_grade_param_keeps_a_ticket_whose_tag_is_all_digits():
    """``--param SEED=17-301122334455`` is a ticket, not 17 minus a number (literal_eval would make it one)."""
    from labkit.cli.grade import _param

    assert _param("SEED=17-301122334455") == ("SEED", "17-301122334455")
    assert _param("SEED=3") == ("SEED", 3) and _param("FAST=True") == ("FAST", True)


def test_a_run_or_a_b_of_another_global_batch_is_refused_naming_both():
    """Item 3 of issue 33: a "fix" of micro_batch 3 × accum 1 trains 3 sequences a step, not 8 — an A/B of it
    read "faster x0.24". Workload.run and Workload.ab refuse it before training, naming both global batches."""
    w = capstone.Workload(capstone._seed_for("tiny_micro"))
    for options in ({"micro_batch": 3, "accum": 1}, {"micro_batch": 8}, {"accum": 2}):
        with pytest.raises(ValueError, match=r"global batch of \d+ sequences.*the job's is 8"):
            w.ab(options, rounds=3)
        with pytest.raises(ValueError, match="global batch"):
            w.run(**options)
    assert capstone.global_batch(w._options(micro_batch=8, accum=1)) == capstone.GLOBAL_BATCH


@pytest.mark.parametrize("options, match", [
    ({"seq_len": 4}, "define the workload"), ({"data_slowdown_s": 0.0}, "define the workload"),
    ({"memory_budget_mb": 100.0}, "define the workload"), ({"model": "tiny"}, "define the workload"),
    ({"not_a_field": 1}, "not TrainConfig fields")])
def test_a_fix_may_change_trainer_options_only(options, match):
    with pytest.raises(ValueError, match=match):
        capstone.Workload(capstone._seed_for("tiny_micro"))._config(**options)


def test_global_batch_counts_micro_batch_times_accum_times_dp_ranks():
    assert capstone.global_batch({"micro_batch": 2, "accum": 4}) == 8
    assert capstone.global_batch({"micro_batch": 1, "accum": 8, "micro_batch_requested": 8}) == 8   # a budget's run
    assert capstone.global_batch({"micro_batch": 1, "accum": 4, "dp_ranks": 2}) == 8
    with pytest.raises(ValueError, match="adaptive"):
        capstone.global_batch({"micro_batch": 2, "accum": "adaptive"})
    with pytest.raises(ValueError, match="dp_ranks"):
        capstone.global_batch({"micro_batch": 2, "accum": 4, "dp_ranks": 2.0})


def test_the_slow_link_mystery_hides_its_link_and_is_fixed_by_syncing_once_per_step():
    """Communication: 2 ranks, one per "node", every micro-batch's gradients all-reduced over a slow link. The
    learner sees DDP, 4 micro-batches of 1 sequence per rank and no_sync=False; the link (its speed, where its
    delay sits) is hidden and may not be changed; no_sync=True keeps the global batch; tp=2 would halve it."""
    seed = capstone._seed_for("slow_link")
    assert capstone._mystery_of(seed).family == "communication"
    w = capstone.Workload(seed)
    opts = w._options()
    assert w._nprocs == 2 and w.device == "cpu"
    assert (opts["parallel"], opts["dp_ranks"], opts["micro_batch"], opts["accum"], opts["no_sync"]) == \
        ("ddp", 2, 1, capstone.GLOBAL_BATCH // 2, False)
    assert capstone.global_batch(opts) == capstone.GLOBAL_BATCH
    assert not set(capstone.HIDDEN) & set(opts) and "name" not in repr(w)
    full = w._config()
    assert full.ranks_per_node == 1 and full.link_overlap and full.inter_node_gbit_s > 0
    fix = capstone.check_options({"no_sync": True})
    assert capstone.global_batch(w._options(**fix)) == capstone.GLOBAL_BATCH and w._config(**fix).no_sync
    with pytest.raises(ValueError, match="global batch of 4"):                           # another job: refused
        w._options(tp=2)
    for forbidden in ({"inter_node_gbit_s": 100.0}, {"link_overlap": False}, {"ranks_per_node": 2}):
        with pytest.raises(ValueError, match="define the workload"):
            w._config(**forbidden)


def test_the_host_stats_mystery_is_fixed_by_taking_the_monitor_out_of_the_step():
    """Scheduling: chapter 18's per-layer gradient statistics (NumPy on the host) computed inside every step. The
    learner sees grad_stats=True among the trainer options; grad_stats=False is a trainer option; the run's length,
    its steps, is not."""
    seed = capstone._seed_for("host_stats")
    assert capstone._mystery_of(seed).family == "scheduling"
    w = capstone.Workload(seed)
    opts = w._options()
    assert w._nprocs == 1 and opts["grad_stats"] is True and opts["dp_ranks"] == 1
    assert capstone.global_batch(opts) == capstone.GLOBAL_BATCH and not set(capstone.HIDDEN) & set(opts)
    fix = capstone.check_options({"grad_stats": False})
    assert capstone.global_batch(w._options(**fix)) == capstone.GLOBAL_BATCH and not w._config(**fix).grad_stats
    for forbidden, match in (({"steps": 3}, "define the workload"), ({"host_stall_s": 0.0}, "define the workload"),
                             ({"grad_stat": False}, "not TrainConfig fields")):
        with pytest.raises(ValueError, match=match):
            w._config(**forbidden)


def test_link_overlap_puts_the_link_in_the_communication_thread(tmp_path):
    """On 2 real gloo ranks (tiny GPT, a link of 0.02 Gb/s: ≈ 0.2 s per all-reduce, far above the compute):
    with link_overlap the trace counts the link's time as exposed communication and diagnose names
    communication; without it the same delay sits inside backward's AccumulateGrad op, counted as compute."""
    from labkit.diagnose import diagnose
    from labkit.trace import analyze
    from labkit.train import TrainConfig, run

    base = TrainConfig(model="tiny", micro_batch=2, steps=3, warmup_steps=1, parallel="ddp", device="cpu",
                       ranks_per_node=1, inter_node_gbit_s=0.02, profile_steps=2)
    with pytest.raises(ValueError, match="link_overlap"):
        TrainConfig(link_overlap=True)
    shares = {}
    for overlap in (True, False):
        out = tmp_path / f"overlap_{overlap}"
        rec = run(base.replace(link_overlap=overlap, profile_dir=str(out)), 2, timeout_s=300)
        assert rec.extra["slow_link"]["injected_s"] > 0.1
        an = analyze(out)
        shares[overlap] = an.comm_wait_share
        if overlap:
            assert diagnose(rec, an).primary == "communication"
    assert shares[True] > 0.5 > shares[False]


def test_the_activation_budget_fits_more_sequences_under_recomputation():
    """inject.plan fits the micro-batch with what a sequence saves under the run's own recomputation policy: the
    memory mystery runs one sequence per micro-batch, with full recomputation 4 fit (a sequence of the small GPT
    saves 3.7x fewer bytes); the global batch stays."""
    import torch

    from labkit.train.inject import plan

    w = capstone.Workload(capstone._seed_for("act_budget"))
    dev = torch.device("cpu")
    given, facts = plan(w._config(), dev)
    fixed, facts_fix = plan(w._config(checkpoint=True), dev)
    assert (given.micro_batch, given.accum, given.checkpoint) == (1, capstone.GLOBAL_BATCH, False)
    assert fixed.micro_batch == 4 and fixed.micro_batch * fixed.accum == capstone.GLOBAL_BATCH and fixed.checkpoint
    assert facts_fix["activation_bytes_per_sample_recomputed"] * 3 < facts["activation_bytes_per_sample"]


def test_release_hides_solutions_and_checks():
    import ast

    from labkit.teaching.grading.labfmt import PROMPT, learner_notebook

    lab = load_lab(LAB)
    assert [q.id for q in lab.questions] == ["q1", "q2"] and lab.max_score == 7
    assert {c.id: c.weight for c in lab.checks if c.question == "q2"} == {
        "q2-hidden": 1, "q2-hidden-ab": 3}
    text = "\n".join(c.source for c in learner_notebook(lab).cells)
    assert "BEGIN SOLUTION" not in text and "evidence(" not in text and "_mystery" not in text and "mystery_of" not in text
    assert "_options" not in text and "_nprocs" not in text and "_config" not in text
    assert text.count(PROMPT) == 2
    for c in learner_notebook(lab).cells:
        if c.cell_type == "code":
            ast.parse(c.source)


# ---------------------------------------------------------------- hidden checks on evidence made here
SEED = capstone._seed_for("tiny_micro")
FIX = {"micro_batch": capstone.GLOBAL_BATCH, "accum": 1}


def _record(step_s: float, steps=(0.98, 1.0, 1.03), **options) -> dict:
    w = capstone.Workload(SEED)      # what Workload.run's record keeps (of any options: the checks judge them)
    cfg = w._public(w._config().replace(**options).to_dict())
    cfg["capstone_seed"] = SEED
    return RunRecord(label="capstone", step_time=Stat.of([step_s * f for f in steps]), config=cfg)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One real traced run of the workload (tiny micro-batches, 3 steps): q1's record and trace."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("lab12_trace")
        rec = capstone.Workload(SEED, steps=3, warmup_steps=1).run(profile_dir=out)
    finally:
        torch.set_num_threads(threads)
    return rec, sorted(out.glob("*.json"))


QUIET = dict(a=[1.0, 1.05, 0.97], a2=[1.02, 0.99, 1.01], b=(1.0, 1.04, 0.98))


def _submit(tmp_path, traced, options, b, *, speedup=None, family="compute", job_s=1.0, fix_s=None,
            steps=(0.98, 1.0, 1.03), a=QUIET["a"], a2=QUIET["a2"], b_spread=QUIET["b"], why=None, ab=True):
    """q1 and q2 evidence: the job's real traced run (``traced``) with its step times set to ``job_s`` s per step
    (spread as ``steps``) and ``why`` as the justification (default: its MFU, as the solution writes it), the A/B's
    job runs ``a``/``a2`` (≈ 1 s), its fix's runs at ``b`` s × ``b_spread`` (none with ``ab=False``), the fix's
    traced run at ``fix_s`` s (default ``b``); for the fixed run one trace file stands in."""
    import copy
    import statistics

    trace = tmp_path / "fixed.json"
    trace.write_text("{}")
    book = EvidenceBook(LAB, root=tmp_path)
    job = copy.deepcopy(traced[0])
    job.step_time = Stat.of([job_s * f for f in steps])
    book.submit("q1", answer={"family": family, "diagnose_primary": "compute",
                              "justification": f"MFU {job.mfu:.1%}, micro-batch 1" if why is None else why},
                record=job, files=traced[1], seed=SEED)
    bs = [b * f for f in b_spread]
    ratio = statistics.median(bs) / statistics.median(a)
    verdict = "faster" if ratio < 0.9 else "no difference at this resolution"
    samples = dict(a=a, b=bs, a2=a2, ratio=ratio, verdict=verdict) if ab else {}
    book.submit("q2", answer={"options": options, "speedup": speedup or 1 / ratio},
                record=_record(b if fix_s is None else fix_s, steps, **options),
                files=[trace], options=options, **samples)
    return book


def _grade(root, ids):
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab(LAB).checks if c.id in ids]
    res = run_checks({"lab": LAB, "work_root": str(root), "checks": checks, "params": {}})
    return {r["id"]: r["passed"] for r in res}, [r["message"] for r in res]


IDS = ("q1-hidden-family", "q2-hidden", "q2-hidden-ab")


def test_hidden_checks_pass_a_real_fix(tmp_path, traced):
    _submit(tmp_path, traced, FIX, 0.25)
    ok, why = _grade(tmp_path, IDS)
    assert ok == dict.fromkeys(IDS, True), why


def test_the_right_family_without_a_speed_up_fails(tmp_path, traced):
    _submit(tmp_path, traced, {"num_workers": 2}, 0.98)
    ok, why = _grade(tmp_path, IDS)
    assert ok == {"q1-hidden-family": True, "q2-hidden": True, "q2-hidden-ab": False}, why
    assert "at least 20 % faster" in why[2]


def test_a_wrong_family_fails_q1(tmp_path, traced):
    _submit(tmp_path, traced, FIX, 0.25, family="data")
    ok, why = _grade(tmp_path, ("q1-hidden-family",))
    assert ok == {"q1-hidden-family": False} and f"workload {SEED}" in why[0], why


@pytest.mark.parametrize("why, match", [
    ("the workload's hidden mystery is tiny_micro (seed 2)", "cites no figure of your run"),   # the oracle's word
    ("MFU 37.5%: small GEMMs", "cites no figure of your run"),                                 # a figure typed in
])
def test_the_family_needs_a_figure_of_the_learner_s_own_run(tmp_path, traced, why, match):
    _submit(tmp_path, traced, FIX, 0.25, why=why)
    ok, msgs = _grade(tmp_path, ("q1-hidden-family",))
    assert ok == {"q1-hidden-family": False} and match in msgs[0], msgs


def test_the_family_needs_its_trace_and_diagnose_s_finding(tmp_path, traced):
    """The oracle's family with its record but no trace recorded fails: the family is named from the trace."""
    _submit(tmp_path, traced, FIX, 0.25)
    book = EvidenceBook(LAB, root=tmp_path)
    ev = book.load("q1")
    book.submit("q1", answer=ev.answered(), record=ev.record, files=[], seed=SEED)
    ok, msgs = _grade(tmp_path, ("q1-hidden-family",))
    assert ok == {"q1-hidden-family": False} and "no trace" in msgs[0], msgs


def test_a_keyed_grader_refuses_the_practice_seed(tmp_path, traced, monkeypatch):
    """With the instructor's key in the checker's environment (``labkit grade --key-file``), the same evidence of
    practice seed SEED fails q1's family: only a ticket the key issued is graded; the key leaves the environment."""
    import os

    _submit(tmp_path, traced, FIX, 0.25)
    monkeypatch.setenv("LABKIT_GRADING_KEY", "0123456789abcdef-secret")
    ok, msgs = _grade(tmp_path, ("q1-hidden-family",))
    assert ok == {"q1-hidden-family": False} and "practice seed" in msgs[0], msgs
    assert "LABKIT_GRADING_KEY" not in os.environ


def test_a_fix_without_an_a_b_scores_nothing(tmp_path, traced):
    """The oracle's fix, traced, with no A/B: neither q2 check passes — the fixed run alone proves no speed-up."""
    _submit(tmp_path, traced, FIX, 0.25, ab=False)
    ok, msgs = _grade(tmp_path, ("q2-hidden", "q2-hidden-ab"))
    assert ok == {"q2-hidden": False, "q2-hidden-ab": False} and "no A/B recorded" in msgs[0], msgs


def test_a_larger_global_batch_or_a_shorter_sequence_is_not_a_fix(tmp_path, traced):
    """Twice the sequences per micro-batch, or half the tokens per sequence: each step is cheaper per sequence or
    shorter — the A/B shows a speed-up, the option check fails."""
    _submit(tmp_path, traced, {"micro_batch": 2 * capstone.GLOBAL_BATCH, "accum": 1}, 0.3)
    ok, why = _grade(tmp_path, IDS)
    assert ok == {"q1-hidden-family": True, "q2-hidden": False, "q2-hidden-ab": True}, why
    assert "global batch" in why[1]
    _submit(tmp_path, traced, {**FIX}, 0.25)
    book = EvidenceBook(LAB, root=tmp_path)
    ev = book.load("q2")
    book.submit("q2", answer={"options": {"seq_len": 4}, "speedup": ev.answered()["speedup"]}, record=ev.record,
                files=ev.files("*.json"), options={"seq_len": 4}, a=ev.value("a"), b=ev.value("b"),
                a2=ev.value("a2"), ratio=ev.value("ratio"), verdict=ev.value("verdict"))
    ok, why = _grade(tmp_path, ("q2-hidden",))
    assert ok == {"q2-hidden": False} and "define the workload" in why[0], why


def test_a_typed_in_speed_up_fails(tmp_path, traced):
    _submit(tmp_path, traced, FIX, 0.25, speedup=6.0)
    ok, why = _grade(tmp_path, IDS)
    assert ok == {"q1-hidden-family": True, "q2-hidden": True, "q2-hidden-ab": False}, why
    assert "the samples give" in why[2]


def test_an_altered_arm_fails_against_the_a_b_s_own_spread(tmp_path, traced):
    """The fix's A/B runs cut to 0.4x after the fact (ratio, speed-up and verdict re-derived to match): 2.5x the
    traced fix — inside the old fixed 4x window, beyond what this A/B's runs strayed from each other (1.08x) times
    the traced run's own steps (1.04x) times 1.5, and beyond the 2x floor."""
    _submit(tmp_path, traced, FIX, 0.1, fix_s=0.25)
    ok, why = _grade(tmp_path, IDS)
    assert ok == {"q1-hidden-family": True, "q2-hidden": True, "q2-hidden-ab": False}, why
    assert "second arm" in why[2] and "run-to-run spread" in why[2], why


def test_a_genuine_a_b_on_a_loaded_machine_passes_though_its_traced_runs_stray(tmp_path, traced):
    """Figures shaped like a loaded 2-core machine's (load 10-16: runs of one config 0.66-1.6 s, a traced fix
    2.75x its arm's median, a traced job 0.6x): the A/B's own spread (2.4x) makes room for both."""
    _submit(tmp_path, traced, FIX, 0.12, job_s=0.6, fix_s=0.33, steps=(0.8, 1.0, 1.3),
            a=[1.0, 1.6, 0.7, 1.2, 0.9], a2=[0.66, 1.1, 1.4, 0.95, 1.05], b_spread=(1.0, 0.75, 1.5, 0.9, 1.2))
    ok, why = _grade(tmp_path, IDS)
    assert ok == dict.fromkeys(IDS, True), why
