"""lab10_planner: the per-learner task (labkit.perf.exercise), the one-launch A/B (ab_train(same_ranks=True)) and
the lab's hidden checks on evidence made here — the solution's answers pass, forged figures fail."""
from __future__ import annotations

import copy
import datetime as _dt
import os

import pytest

from labkit import perf
from labkit.measure import ab
from labkit.perf import exercise
from labkit.perf.predict import TERMS
from labkit.record import RunRecord, Stat
from labkit.teaching.grading import EvidenceBook, load_lab
from labkit.teaching.grading.checker import run_checks
from labkit.train import TrainConfig
from labkit.train.pipeline import bubble_fraction


def test_assignment_is_deterministic_spread_and_holds_no_answer():
    seen = {(t.model, t.cluster_name, t.global_batch) for t in map(exercise.assignment, range(40))}
    assert len(seen) >= 8
    a, b = exercise.assignment(3), exercise.assignment(3)
    assert a == b and a.cluster.nodes == a.nodes >= 2 and a.model in {s.model for s in exercise.SCENARIOS}
    public = {k for k in dir(a) if not k.startswith("_")}
    assert public == {"seed", "model", "seq_len", "global_batch", "cluster_name", "nodes", "cluster", "describe"}
    with pytest.raises(ValueError, match="seed"):
        exercise.assignment(-1)


def test_layout_round_trip_and_clear_errors():
    lay = perf.Layout(dp=4, tp=2, pp=2, strategy="zero1", micro_batch=2, schedule="interleaved", virtual_stages=2)
    assert exercise.layout_from(exercise.layout_dict(lay)) == lay
    d = exercise.layout_dict(lay)
    with pytest.raises(ValueError, match="missing \\['dp'\\]"):
        exercise.layout_from({k: v for k, v in d.items() if k != "dp"})
    with pytest.raises(ValueError, match="unknown \\['gpus'\\]"):
        exercise.layout_from({**d, "gpus": 8})
    with pytest.raises(TypeError, match="Layout"):
        exercise.layout_dict({"dp": 1})


@pytest.mark.slow
@pytest.mark.parametrize("scenario", exercise.SCENARIOS, ids=lambda s: f"{s.model}-{s.cluster}x{s.nodes}")
def test_every_scenario_has_a_layout_inside_nodes_and_a_slower_one_across(scenario):
    cl = perf.cluster(scenario.cluster, nodes=scenario.nodes)
    pl = perf.plan(scenario.model, cl, global_batch=scenario.global_batch, seq_len=scenario.seq_len,
                   allow_cross_node_tp=True)
    inside = [p for p in pl.predictions if p.layout.tp <= cl.gpus_per_node]
    cross = [p for p in pl.predictions if p.layout.tp > cl.gpus_per_node]
    assert inside and cross and cross[0].step_s > 1.2 * inside[0].step_s
    tm, tr = inside[0].terms(), cross[0].terms()
    assert max(TERMS, key=lambda k: tr[k] - tm[k]) == "tp"


def test_call_order_is_the_order_ab_compare_calls():
    calls = []
    ab.ab_compare(lambda: calls.append("a") or 1.0, lambda: calls.append("b") or 2.0, rounds=4, warmup=1,
                  metric="throughput", seed=None)
    assert calls == ["b" if arm == "B" else "a" for arm, _ in ab.call_order(4, 1)]
    assert ab.call_order(3, 0)[:3] == [("A", "round 1"), ("B", "round 1"), ("A'", "round 1")]


def test_ab_train_same_ranks_runs_every_arm_in_one_launch_on_gloo():
    a = TrainConfig(model="tiny", parallel="ddp", micro_batch=2, steps=3, warmup_steps=1, device="cpu", label="mb2")
    b = a.replace(micro_batch=4, label="mb4")
    res = ab.ab_train(a, b, nprocs=2, rounds=3, warmup=0, metric="throughput", same_ranks=True, timeout_s=300)
    assert [(r["arm"], r["when"]) for r in res.runs] == ab.call_order(3, 0)
    for r in res.runs:
        assert r["config"]["micro_batch"] == (4 if r["arm"] == "B" else 2) and r["device"]["count"] == 2
    b_figs = [r["tokens_per_step"] / r["step_time"]["median"] for r in res.runs if r["arm"] == "B"]
    assert list(res.b) == pytest.approx(b_figs, rel=1e-12)
    assert "runs" in res.to_dict() and res.labels == ("mb2", "mb4")


# ------------------------------------------------------------------ the lab's hidden checks, on evidence made here
def _rec(cfg: TrainConfig, step_s: float) -> dict:
    rec = RunRecord(label=cfg.label, step_time=Stat.of([step_s] * 3), tokens_per_step=512, config=cfg.to_dict())
    rec.device.update({"kind": "cpu", "count": 2})
    return rec.to_dict()


def _book(root, seed=5):
    t = exercise.assignment(seed)
    cl = t.cluster
    pl = perf.plan(t.model, cl, global_batch=t.global_batch, seq_len=t.seq_len, allow_cross_node_tp=True)
    mine = next(p for p in pl.predictions if p.layout.tp <= cl.gpus_per_node)
    rival = next(p for p in pl.predictions if p.layout.tp > cl.gpus_per_node)
    lay = mine.layout
    q1 = {"layout": exercise.layout_dict(lay), "step_s": mine.step_s, "tokens_per_s": mine.tokens_per_s,
          "mfu": mine.mfu, "memory_gib": mine.memory["total"] / 2**30, "micro_batches": mine.micro_batches,
          "bubble": bubble_fraction(lay.pp, mine.micro_batches, lay.virtual_stages) if lay.pp > 1 else 0.0}
    tm, tr = mine.terms(), rival.terms()
    q2 = {"rival": exercise.layout_dict(rival.layout), "slowdown": rival.step_s / mine.step_s,
          "term": max(TERMS, key=lambda k: tr[k] - tm[k]), "tp_ms": {"mine": tm["tp"] * 1e3, "rival": tr["tp"] * 1e3}}
    ca = TrainConfig(model="tiny", parallel="ddp", micro_batch=4, steps=5, warmup_steps=1, device="cpu", label="DP2")
    cb = ca.replace(parallel="single", tp=2, micro_batch=8, label="TP2")
    order = ab.call_order(4, 1)
    steps = {"A": 0.25, "A'": 0.252, "B": 0.40}
    # stamped as ab_train(same_ranks=True) stamps them: launched by this process (the one writing the evidence),
    # in one launch long enough for their timed steps, ended before the evidence is written
    now = _dt.datetime.now(_dt.timezone.utc)
    launch = {"pid": os.getpid(), "started_at": (now - _dt.timedelta(seconds=60)).isoformat(),
              "ended_at": (now - _dt.timedelta(seconds=2)).isoformat()}
    runs = [{**_rec(cb if arm == "B" else ca, steps[arm] * (1 + 0.01 * i)), "arm": arm, "when": when, "launch": launch}
            for i, (arm, when) in enumerate(order)]
    qa = [r["tokens_per_step"] / r["step_time"]["median"] for r in runs if r["arm"] != "B"]
    qb = [r["tokens_per_step"] / r["step_time"]["median"] for r in runs if r["arm"] == "B"]
    res = ab.ab_compare(lambda: qa.pop(0), lambda: qb.pop(0), rounds=4, warmup=1, metric="throughput", seed=None)
    q3 = {"tp_all_reduces": 8, "slowdown": 1 / res.ratio, "verdict": res.verdict}
    book = EvidenceBook("lab10_planner", root=root)

    def submit(answers=None, runs_=None):
        a = {"q1": q1, "q2": q2, "q3": q3, **(answers or {})}
        book.submit("q1", answer=a["q1"], seed=seed, model=t.model, global_batch=t.global_batch, seq_len=t.seq_len,
                    cluster=t.cluster_name, nodes=t.nodes)
        book.submit("q2", answer=a["q2"])
        book.submit("q3", answer=a["q3"], runs=runs_ or runs, a=list(res.a), b=list(res.b), a2=list(res.a2),
                    rounds=4, warmup=1, cfg_a=ca.to_dict(), cfg_b=cb.to_dict())
    return submit, {"q1": q1, "q2": q2, "q3": q3, "runs": runs}


def _run(root, params=None):
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab("lab10_planner").checks]
    res = run_checks({"lab": "lab10_planner", "work_root": str(root), "checks": checks, "params": params or {}})
    return {r["id"]: r for r in res}


@pytest.mark.slow
def test_lab10_solution_passes_and_each_forgery_fails_its_check(tmp_path):
    submit, a = _book(tmp_path)
    assert a["q3"]["verdict"] == "slower"
    submit()
    res = _run(tmp_path)
    assert all(r["passed"] for r in res.values()), {k: r["message"] for k, r in res.items() if not r["passed"]}
    # a planner figure typed in: 10 % more tokens/s than predict gives for the recorded layout
    submit({"q1": {**a["q1"], "tokens_per_s": a["q1"]["tokens_per_s"] * 1.1}})
    res = _run(tmp_path)
    assert not res["q1-hidden"]["passed"] and "tokens_per_s" in res["q1-hidden"]["message"]
    assert res["q2-hidden"]["passed"] and res["q3-hidden"]["passed"]
    # a rival that is not the best across nodes: the cross-node layout made worse (no longer the planner's best)
    t = exercise.assignment(5)
    worse = copy.deepcopy(a["q2"])
    pl = perf.plan(t.model, t.cluster, global_batch=t.global_batch, seq_len=t.seq_len, allow_cross_node_tp=True)
    slow = [p for p in pl.predictions if p.layout.tp > t.cluster.gpus_per_node][-1]
    worse["rival"] = exercise.layout_dict(slow.layout)
    submit({"q2": worse})
    res = _run(tmp_path)
    assert not res["q2-hidden-rival"]["passed"] and not res["q2-hidden"]["passed"]
    # a faster TP2 run, typed into its record: the samples no longer follow from the runs
    runs = copy.deepcopy(a["runs"])
    b0 = next(r for r in runs if r["arm"] == "B" and r["when"].startswith("round"))   # warm-ups are not samples
    b0["step_time"] = {k: (v / 1.2 if k != "n" and v is not None else v) for k, v in b0["step_time"].items()}
    submit(runs_=runs)
    res = _run(tmp_path)
    assert not res["q3-hidden"]["passed"] and "samples" in res["q3-hidden"]["message"]
    # a seed the grader did not give: the task is another learner's
    submit()
    res = _run(tmp_path, params={"SEED": 6})
    assert not res["q1-hidden"]["passed"] and "SEED=6" in res["q1-hidden"]["message"]
