"""labkit.perf.planner: enumeration under the memory limit, ranking, explain(), and chapter 24's rule
(keep TP inside a node when the network between nodes is slow)."""
from __future__ import annotations

import pytest

from labkit.flops import ModelShape
from labkit.perf import cluster, plan, predict

LLAMA_13B = ModelShape(n_layers=40, d_model=5120, n_heads=40, d_ff=13824, vocab_size=32000, seq_len=2048,
                       ffn="swiglu", tied_embeddings=False, norm="rmsnorm", pos_emb="rope", name="llama-13b")


@pytest.fixture(scope="module")
def slow_70b():
    """Llama 3 70B on 8 nodes × 8 A100 joined by 25 Gb/s Ethernet, TP across nodes allowed."""
    return plan("llama3-70b", cluster("a100-25gbe"), global_batch=512, seq_len=4096, allow_cross_node_tp=True,
                strategies=("zero1", "zero2"), micro_batches=(1, 2))


def test_ranked_feasible_and_within_memory(slow_70b):
    p, c = slow_70b, cluster("a100-25gbe")
    steps = [x.step_s for x in p.predictions]
    assert steps == sorted(steps) and len(steps) > 10
    for x in p.predictions:
        assert x.layout.world_size == c.n_gpus and x.memory["total"] <= p.memory_limit
        assert 64 % x.layout.tp == 0 and x.layout.pp <= 80 and -(-80 // x.layout.pp) * x.layout.pp / 80 <= 1.25
    assert p.rejected and all("GiB" in why for _, why in p.rejected)
    t = p.table(5)
    assert list(t["rank"]) == [1, 2, 3, 4, 5]
    assert t["tokens_per_s"].is_monotonic_decreasing
    assert (t["tokens_per_s_per_gpu"] * c.n_gpus).round(6).equals(t["tokens_per_s"].round(6))


def test_slow_network_keeps_tp_inside_a_node_and_says_so(slow_70b, capsys):
    p = slow_70b
    best = p.best
    cross = [x for x in p.predictions if x.layout.tp > 8]
    assert cross, "cross-node TP layouts were allowed and some fit"
    assert best.layout.tp <= 8
    assert best.tokens_per_s > 2 * cross[0].tokens_per_s
    text = p.explain()
    with capsys.disabled():
        print("\n" + p.table(3).to_string() + "\n" + text)
    assert "kept inside a node" in text and "TP across nodes" in text and "Decided by" in text


def test_explain_names_the_deciding_term():
    p = plan(LLAMA_13B, cluster("a100-25gbe", nodes=16), global_batch=2048, strategies=("zero2",),
             micro_batches=(1, 4), recompute=("none",))
    best, run = p.predictions[:2]
    diffs = {k: run.terms()[k] - best.terms()[k] for k in best.terms()}
    key = max(diffs, key=diffs.get)
    from labkit.perf.predict import TERM_LABELS
    assert f"Decided by {TERM_LABELS[key]}" in p.explain() or "A tie in time" in p.explain()


def test_no_feasible_layout_is_explained_and_best_raises():
    p = plan("llama3-405b", cluster("dgx-a100", nodes=1), global_batch=8, seq_len=2048, strategies=("ddp",),
             micro_batches=(1,), recompute=("full",))
    assert not p.predictions and "No feasible layout" in p.explain()
    with pytest.raises(ValueError, match="no layout of llama3-405b fits"):
        _ = p.best


@pytest.mark.parametrize("kw, match", [
    (dict(strategies=("zero9",)), r"strategies item='zero9'"),
    (dict(strategies="zero1"), r"strategies must be a non-empty list"),
    (dict(micro_batches=(0,)), r"micro_batches item=0"),
    (dict(memory_fraction=0), r"memory_fraction=0"),
    (dict(n_gpus=65), r"n_gpus=65"),
    (dict(schedule="interleaved"), r"schedule='interleaved'"),
    (dict(global_batch=0), r"global_batch=0"),
    (dict(virtual_stages=(1,)), r"virtual_stages item=1"),
    (dict(virtual_stages=2), r"virtual_stages must be a list"),
])
def test_bad_arguments(kw, match):
    args = dict(global_batch=64, seq_len=1024) | kw
    with pytest.raises(ValueError, match=match):
        plan("llama3-8b", cluster("dgx-a100"), **args)


def test_interleaved_schedules_are_searched_and_shrink_the_bubble():
    """With pp > 1 the planner tries v model chunks per stage (v dividing layers / pp): the interleaved
    layout's bubble is the 1F1B one divided by v, and its pipeline sends are v times as many."""
    args = dict(global_batch=64, seq_len=4096, micro_batches=(1,), strategies=("zero1",), recompute=("selective",))
    p = plan("llama3-70b", cluster("a100-25gbe"), **args)
    by = {(q.layout.dp, q.layout.tp, q.layout.pp, q.layout.virtual_stages): q for q in p.predictions}
    # even splits (uneven stages also price the slowest stage's extra layers: compared in the test below)
    pairs = [(k, k[:3] + (v,)) for k in by if k[3] == 1 and k[2] > 1 and 80 % (k[2] * 4) == 0 for v in (2, 4)
             if k[:3] + (v,) in by]
    assert pairs, sorted(by)
    for one, inter in pairs:
        a, b = by[one], by[inter]
        assert b.layout.schedule == "interleaved" and a.layout.schedule == "1f1b"
        assert b.terms()["bubble"] == pytest.approx(a.terms()["bubble"] / inter[3], rel=1e-9)
        assert b.comm_s["pp"] == pytest.approx(a.comm_s["pp"] * inter[3], rel=1e-9)
    assert all(q.layout.virtual_stages == 1 for q in plan("llama3-70b", cluster("a100-25gbe"), virtual_stages=(),
                                                          **args).predictions)


def test_context_and_expert_parallel_are_searched_where_they_divide():
    """CP degrees divide the sequence and the GPUs left by tp·pp; EP degrees only on a MoE model, dividing
    dp and the experts; a dense model never gets ep > 1, and (1,) searches neither."""
    args = dict(global_batch=64, seq_len=4096, micro_batches=(1,), strategies=("zero1",), recompute=("selective",),
                virtual_stages=())
    dense = plan("llama3-8b", cluster("dgx-a100", nodes=2), context_parallel=(1, 2, 4, 8), **args)
    cps = {q.layout.cp for q in dense.predictions}
    assert cps == {1, 2, 4, 8} and all(q.layout.ep == 1 for q in dense.predictions)
    for q in dense.predictions:
        lay = q.layout
        assert lay.dp * lay.tp * lay.pp * lay.cp == 16 and 4096 % lay.cp == 0
    cp2 = next(q for q in dense.predictions if q.layout.cp == 2)
    assert cp2.comm_s["cp"] > 0 and "cp" in dense.table().columns
    assert {q.layout.cp for q in plan("llama3-8b", cluster("dgx-a100", nodes=2), **args).predictions} == {1}  # default
    moe = plan("mixtral-8x7b", cluster("dgx-a100", nodes=2), **args)
    eps = {q.layout.ep for q in moe.predictions}
    assert eps > {1} and eps <= {1, 2, 4, 8}
    for q in moe.predictions:
        assert q.layout.dp % q.layout.ep == 0 and 8 % q.layout.ep == 0
        assert (q.comm_s.get("ep", 0) > 0) == (q.layout.ep > 1)
    ep_best = max((q for q in moe.predictions if q.layout.ep > 1), key=lambda q: q.tokens_per_s)
    same_without = predict("mixtral-8x7b", ep_best.layout.with_(ep=1), cluster("dgx-a100", nodes=2), global_batch=64,
                           seq_len=4096)
    assert ep_best.memory["total"] < same_without.memory["total"]                    # experts split: less to hold
    with pytest.raises(ValueError, match="context_parallel item=0"):
        plan("llama3-8b", cluster("dgx-a100"), context_parallel=(0,), **args)
    with pytest.raises(ValueError, match="expert_parallel must be a non-empty list"):
        plan("llama3-8b", cluster("dgx-a100"), expert_parallel=(), **args)


# ---------------------------------------------------------------- issue #28
def test_llama3_405b_on_16384_h100s_considers_pp16_over_126_layers():
    """The published layout is PP16 over 126 layers (uneven stages, Dubey et al. 2024 §3.3.2); the planner
    tried only pp dividing the layers (1 and 2). The imbalance is priced as predict prices it."""
    p = plan("llama3-405b", cluster("dgx-h100", nodes=2048), global_batch=2048, seq_len=8192,
             micro_batches=(1,), strategies=("zero1", "fsdp"), recompute=("none", "full"))
    pp16 = p.best_with(pp=16)
    assert 126 % 16 and pp16.layout.tp == 8 and 0 < pp16.mfu < 1
    c = pp16.layout.pp * pp16.layout.virtual_stages
    assert any(f"×{-(-126 // c) * c / 126:.3f}" in a for a in pp16.assumptions), pp16.assumptions
    assert "Best with uneven pipeline stages" in p.explain()
    even = [q for q in p.predictions if 126 % (q.layout.pp * q.layout.virtual_stages) == 0]
    assert even and len(even) < len(p.predictions)


def test_sequence_parallel_string_false_is_refused_not_read_as_true():
    """sequence_parallel='False' gave 272 layouts sequence parallelism."""
    for kw in (dict(sequence_parallel="False"), dict(flash_attention="false"), dict(allow_cross_node_tp=0)):
        with pytest.raises(ValueError, match=rf"{next(iter(kw))} must be True or False"):
            plan("llama3-8b", cluster("dgx-a100"), global_batch=64, seq_len=1024, **kw)


def test_gpu_count_is_capped_and_divisors_come_from_factorisation():
    from labkit.perf.planner import MAX_GPUS, _divisors

    assert _divisors(1) == [1] and _divisors(126) == [1, 2, 3, 6, 7, 9, 14, 18, 21, 42, 63, 126]
    assert all(_divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 400))
    assert len(_divisors(2**40 * 3)) == 82 and _divisors(2**31 - 1) == [1, 2**31 - 1]     # a prime: √n steps
    with pytest.raises(ValueError, match=r"is not valid for the planner: use at most 16,777,216"):
        plan("llama3-8b", cluster("dgx-a100", nodes=MAX_GPUS), global_batch=64, seq_len=1024)


def test_explain_says_a_tie_in_time_and_memory_and_what_differs():
    """lab10's seed 0 (GPT-3 175B on 64 H100): ZeRO-3 and FSDP tie in step time and memory; explain() must not say
    the winner 'ranks first on memory' (68.1 vs 68.1 GiB) but name the one difference between them."""
    from labkit.perf import exercise

    t = exercise.assignment(0)
    text = plan(t.model, t.cluster, global_batch=t.global_batch, seq_len=t.seq_len, allow_cross_node_tp=True).explain()
    assert "A tie in time and memory" in text and "ranks first on memory" not in text
    assert "differ only in strategy zero3 vs fsdp" in text
    assert "tokens/s aggregate (" in text.splitlines()[0]
