"""labkit.perf.predict: the step model of a parallel layout, its checks, and the course's published cases.

Cases (chapter 5/30 BERT-large, chapter 29 13B over 25 Gb/s Ethernet, Megatron-LM SC21 Table 1,
Llama 3 Table 4) print predicted vs published figures (``pytest -s`` shows them) and assert the
behaviour, not restated constants.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from labkit import flops
from labkit.flops import ModelShape
from labkit.perf import CLUSTERS, Layout, cluster, predict
from labkit.perf.predict import TERMS

BERT_LARGE = ModelShape(n_layers=24, d_model=1024, n_heads=16, vocab_size=30522, seq_len=512, bias=True,
                        name="bert-large")


def _p(model="llama3-70b", cl="dgx-a100", *, B=512, seq=4096, **lay):
    return predict(model, Layout(**lay), cluster(cl) if isinstance(cl, str) else cl, global_batch=B, seq_len=seq)


# ----------------------------------------------------------------------------------------- the model
def test_terms_add_up_and_throughput_is_consistent():
    p = _p(dp=2, tp=8, pp=4, strategy="zero1", recompute="selective", sequence_parallel=True)
    assert set(p.terms()) == set(TERMS)
    assert p.step_s == pytest.approx(sum(p.terms().values()))
    assert p.tokens_per_s == pytest.approx(512 * 4096 / p.step_s)
    assert p.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_s / 64)
    assert 0 < p.mfu < p.hfu <= p.achievable            # selective recompute: hardware FLOPs > model FLOPs
    for k, v in p.exposed_s.items():                    # nothing hides more than it takes
        assert 0 <= v <= p.comm_s[k] + 1e-12
    text = p.table()
    assert "tokens/s aggregate" in text and "per GPU" in text and "assumptions:" in text
    assert p.as_dict()["terms_s"] == p.terms()


def test_bubble_shrinks_with_micro_batches_and_interleaving():
    base = dict(dp=1, tp=8, pp=8, micro_batch=1)
    few, many = _p(B=16, **base), _p(B=64, **base)
    assert few.bubble_s / few.compute_s == pytest.approx(7 / 16)          # (p−1)/m
    assert many.bubble_s / many.compute_s < few.bubble_s / few.compute_s
    inter = _p(B=16, schedule="interleaved", virtual_stages=2, **base)
    assert inter.bubble_s == pytest.approx(few.bubble_s / 2)              # ÷ v (Narayanan et al. 2021)
    assert inter.comm_s["pp"] == pytest.approx(2 * few.comm_s["pp"])      # v× the sends


def test_tp_across_nodes_costs_more_than_inside_a_node():
    for cl, factor in (("dgx-a100", 2), ("a100-25gbe", 50)):       # InfiniBand, then 25 Gb/s Ethernet
        inside = _p(dp=8, tp=8, B=256, cl=cl)
        across = _p(dp=4, tp=16, B=256, cl=cl)
        assert across.comm_s["tp"] > factor * inside.comm_s["tp"]
        assert across.tokens_per_s < inside.tokens_per_s
        assert "across nodes" in " ".join(across.assumptions)


def test_slower_network_exposes_more_dp_communication():
    fast = cluster("dgx-a100")
    slow = replace(fast, inter_bw=fast.inter_bw / 64)
    a, b = (predict("llama3-8b", Layout(dp=64, strategy="zero2", micro_batch=2), c, global_batch=512, seq_len=4096)
            for c in (fast, slow))
    assert b.comm_s["dp"] > 30 * a.comm_s["dp"] and b.exposed_s["dp"] > a.exposed_s["dp"]
    assert b.tokens_per_s_per_gpu < a.tokens_per_s_per_gpu


def test_overlap_choices():
    kw = dict(global_batch=64, seq_len=2048)
    lay, c = Layout(dp=64, micro_batch=1), cluster("a100-25gbe")
    none = predict("llama3-8b", lay, c, dp_overlap=False, **kw)
    full = predict("llama3-8b", lay, c, **kw)
    step = predict("llama3-8b", lay, c, overlap_window="step", **kw)
    assert none.exposed_s["dp"] == pytest.approx(none.comm_s["dp"])
    assert step.exposed_s["dp"] <= full.exposed_s["dp"] <= none.exposed_s["dp"]


def test_recompute_and_sharding_trade_memory_for_time():
    kw = dict(dp=8, tp=8, B=64, seq=4096)
    none, full = _p(recompute="none", **kw), _p(recompute="full", **kw)
    assert full.compute_s > none.compute_s and full.memory["activations"] < none.memory["activations"] / 5
    ddp, z3 = _p(strategy="ddp", **kw), _p(strategy="zero3", **kw)
    assert z3.memory["model_states"] < ddp.memory["model_states"] / 4
    assert z3.comm_s["dp"] > ddp.comm_s["dp"]            # parameters gathered every micro-batch


def test_model_inputs_preset_shape_and_hf_config():
    shape = flops.preset("llama3-8b")
    a = predict("llama3-8b", Layout(dp=8), cluster("dgx-h100"), global_batch=64, seq_len=1024)
    b = predict(replace(shape, seq_len=1024), Layout(dp=8), cluster("dgx-h100"), global_batch=64)
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "max_position_embeddings": 8192}
    c = predict(cfg, Layout(dp=8), cluster("dgx-h100"), global_batch=64, seq_len=1024)
    assert a.step_s == pytest.approx(b.step_s) == pytest.approx(c.step_s)


@pytest.mark.parametrize("make, match", [
    (lambda: Layout(strategy="zero9"), r"strategy='zero9'.*ddp.*zero3"),
    (lambda: Layout(dp=4, ep=3), r"ep=3.*dp=4"),
    (lambda: Layout(virtual_stages=2, pp=4), r"virtual_stages=2.*interleaved"),
    (lambda: Layout(tp=0), r"tp=0"),
    (lambda: Layout(recompute="some"), r"recompute='some'.*selective"),
    (lambda: cluster("dgx-z100"), r"cluster='dgx-z100'.*dgx-a100"),
    (lambda: replace(CLUSTERS["dgx-a100"], device="A100"), r"'A100'.*family"),
    (lambda: replace(CLUSTERS["dgx-a100"], inter_bw=0), r"inter_bw=0"),
    (lambda: _p(dp=128), r"128 GPUs.*64"),
    (lambda: _p(dp=1, tp=3), r"tp=3.*n_heads=64"),
    (lambda: _p(dp=3, B=512), r"global_batch=512.*micro_batch × dp"),
    (lambda: _p(dp=8, accum=3, B=512), r"global_batch=512.*accum"),
    (lambda: _p(dp=1, cp=3), r"cp=3.*seq_len=4096"),
    (lambda: predict("llama3-8b", Layout(), cluster("dgx-a100"), global_batch=8, achievable={"fp16": 0.5}),
     r"achievable=.*dtype='bf16'"),
    (lambda: predict("llama3-8b", Layout(), cluster("dgx-a100"), global_batch=8, achievable=1.5), r"achievable=1.5"),
    (lambda: predict("no-such-model", Layout(), cluster("dgx-a100"), global_batch=8), r"model='no-such-model'"),
    (lambda: predict("llama3-8b", Layout(), cluster("v100-nvlink-4"), global_batch=8), r"dtype='bf16'.*V100"),
])
def test_bad_inputs_name_the_value_and_what_is_valid(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------------------------- chapter 5 / 30: BERT-large on 4 GPUs
def test_bert_large_case_rebuilt_by_predict(capsys):
    """Chapter 5: the source's one-GPU 360 ms and 4-GPU compute 90 ms, all-reduce 120 ms, sync 15 ms
    (labkit.teaching.cases.bert_large): overlapped max(90, 120) + 15 = 135 ms (2.67×), 225 ms without overlap. The
    achievable fraction is solved from the one-GPU step and the link from the all-reduce (as a learner fits
    them from measurements; fp32 gradients, as the case); predict then gives both step models."""
    from labkit.teaching.cases import bert_large

    case = bert_large()
    parts = case.parts
    B, c = 4, cluster("v100-nvlink-4")             # 4 × 512 tokens: an fp32 V100 reaches 360 ms below peak
    one = predict(BERT_LARGE, Layout(micro_batch=B, dtype="fp32"), c, global_batch=B)
    frac = one.achievable * one.step_s / parts.compute_s / 4     # the fraction that makes one GPU take t1
    grads = flops.n_params(BERT_LARGE) * 4               # fp32 gradients, one all-reduce per step
    link = replace(c, intra_bw=2 * 3 / 4 * grads / parts.comm_s, intra_alpha_s=0.0)
    kw = dict(global_batch=B, achievable=frac, sync_s=parts.sync_s, overlap_window="step")
    lay4 = Layout(dp=4, micro_batch=B // 4, dtype="fp32")
    over = predict(BERT_LARGE, lay4, link, **kw)
    serial = predict(BERT_LARGE, lay4, link, dp_overlap=False, **kw)
    nvlink = predict(BERT_LARGE, lay4, c, **kw)
    t1 = predict(BERT_LARGE, Layout(micro_batch=B, dtype="fp32"), c, global_batch=B, achievable=frac).step_s
    with capsys.disabled():
        print(f"\nBERT-large: 1 GPU {t1 * 1e3:.0f} ms; 4 GPUs compute {over.compute_s * 1e3:.0f} ms, all-reduce "
              f"{over.comm_s['dp'] * 1e3:.0f} ms, sync {over.sync_s * 1e3:.0f} ms -> overlapped {over.step_s * 1e3:.0f} "
              f"ms ({t1 / over.step_s:.2f}x), serial {serial.step_s * 1e3:.0f} ms ({t1 / serial.step_s:.2f}x). "
              f"Achievable fraction {frac:.1%}; the all-reduce implies a {link.intra_bw / 1e9:.1f} GB/s link, NVLink's "
              f"{c.intra_bw / 1e9:g} GB/s gives {nvlink.comm_s['dp'] * 1e3:.1f} ms")
    assert t1 == pytest.approx(case.t1_ms / 1e3)
    assert over.compute_s == pytest.approx(parts.compute_s) and over.comm_s["dp"] == pytest.approx(parts.comm_s)
    assert over.step_s * 1e3 == pytest.approx(case.step_ms(True)) and t1 / over.step_s == pytest.approx(case.speedup())
    assert serial.step_s * 1e3 == pytest.approx(case.step_ms(False))
    assert nvlink.comm_s["dp"] < parts.comm_s / 5       # the case's all-reduce was far slower than NVLink


# ---------------------------------------------------- chapter 29: 13B on 64 -> 128 A100 over 25 Gb/s Ethernet
def test_13b_over_25gbe_pure_dp_collapses_and_tp_pp_accumulation_recovers(capsys):
    """Syllabus ch. 29: per GPU 3.6k expected, 2.1k measured on 128 GPUs (58%), 3.3k after the fix (TP+PP,
    accumulation, loader prefetch; 92%). The model (labkit.teaching.cases.thirteen_b().modelled: LLaMA-13B, 2048 ×
    2048-token batches, pure DP = ZeRO-2, the fix = TP2 × PP2 × DP32 with 4× accumulation) gives the
    direction; the magnitudes and the gap are the case's ⚠ f, asserted here as the model's figures."""
    from labkit.teaching.cases import thirteen_b, warnings_markdown

    case = thirteen_b()
    d64, d128, fix = case.modelled().values()
    g = case.modelled_gap()
    with capsys.disabled():
        for name, p in (("pure DP, 64", d64), ("pure DP, 128", d128), ("TP2+PP2+4x accum, 128", fix)):
            print(f"\n13B {name:>22} GPUs: {p.tokens_per_s:>9,.0f} tokens/s aggregate, {p.tokens_per_s_per_gpu:>6,.0f} "
                  f"per GPU = {p.tokens_per_s_per_gpu / d64.tokens_per_s_per_gpu:.0%} of the 64-GPU rate, "
                  f"{p.efficiency:.0%} of compute alone (published: 58% pure DP at 128, 92% fixed)", end="")
        print()
    # the model's figures (deterministic arithmetic of labkit.perf, not timings)
    # (the fix with TP × PP inside a node — issue #34: with PP outermost its sends crossed the 25 GbE — 1,517)
    assert [round(x) for x in g["per_gpu"]] == pytest.approx([1414, 1087, 1517], abs=15)
    assert g["vs_64"] == pytest.approx([0.77, 1.07], abs=0.01) and g["vs_compute"] == pytest.approx([0.57, 0.80], abs=0.01)
    # direction: aggregate still grows 64 -> 128, per GPU it collapses; the fix recovers per GPU
    assert d128.tokens_per_s > d64.tokens_per_s and d128.tokens_per_s_per_gpu < 0.85 * d64.tokens_per_s_per_gpu
    assert d128.exposed_s["dp"] > d128.compute_s * 0.5                # decided by the 25 Gb/s all-reduce
    assert fix.tokens_per_s_per_gpu > 1.3 * d128.tokens_per_s_per_gpu and fix.efficiency > d128.efficiency + 0.15
    assert "inside a node" in " ".join(fix.assumptions)
    # the gap, stated by the ⚠: 58% needs time outside compute+comm; 92% of compute alone needs hidden traffic
    need, have = g["step_128"]
    comp, allow, link, _ = g["fix"]
    assert need - have > 5 and link > allow + 5
    md = warnings_markdown(case, "f")
    assert f"{need - have:.1f} s short" in md and f"{link:.1f} s of the 25 Gb/s ports" in md and "77% → 107%" in md


# -------------------------------------------------------- Megatron-LM SC21 (Narayanan et al. 2021), Table 1
def _gpt(L, h, a):
    """Table 1's GPT shapes: vocabulary 51,200, sequence 2048 (§5.1)."""
    return ModelShape(n_layers=L, d_model=h, n_heads=a, vocab_size=51200, seq_len=2048, bias=True, name=f"gpt-{h}")


# (name, shape (layers, hidden, heads), t, p, GPUs, batch, published TFLOP/s per GPU, published % of peak):
# Narayanan et al. 2021 (arXiv 2104.04473), Table 1. Checked against the abstract (1T: 3072 GPUs, 502
# petaFLOP/s, 52% of peak) and three independent public transcriptions of the full table that agree on
# every cell used here (GitHub files found by exact-string search, e.g. "| 145.6 | 96 | 12288 | 80 | 8 | 8 |
# 1536 | 2304 | 148 | 47% | 227.1 |"); the paper's PDF itself was not reachable from this machine.
SC21 = [("1.7B", _gpt(24, 2304, 24), 1, 1, 32, 512, 137, 44), ("18.4B", _gpt(40, 6144, 48), 8, 1, 256, 1024, 135, 43),
        ("145.6B", _gpt(80, 12288, 96), 8, 8, 1536, 2304, 148, 47),
        ("1T", _gpt(128, 25600, 160), 8, 64, 3072, 3072, 163, 52)]


def test_sc21_rows_are_self_consistent():
    """The transcribed rows agree with themselves: % of peak = TFLOP/s ÷ 312 (A100 fp16 dense), and the
    shapes give Table 1's parameter counts to its one decimal (1.7, 18.4, 145.6, 1008.0 billion)."""
    for (name, shape, *_, tflops, pct), billions in zip(SC21, (1.7, 18.4, 145.6, 1008.0), strict=True):
        assert round(tflops / 312 * 100) == pct, name
        assert round(flops.n_params(shape) / 1e9, 1) == billions, name


@pytest.mark.parametrize("name, shape, t, p, n, B, tflops, published", SC21, ids=[r[0] for r in SC21])
def test_megatron_sc21_table1_within_10_points(name, shape, t, p, n, B, tflops, published, capsys):
    """SC21's "% of peak" counts recomputation (eq. 3, the factor 4 of full activation recomputation), so it
    is compared with predicted HFU under the "megatron" FLOP convention. Assumptions that move it: 50% of
    the fp16 peak achievable; micro-batch 1; 1F1B without interleaving; no sequence parallelism or flash
    attention (2021); DP all-reduce hidden only under the last micro-batch's backward."""
    lay = Layout(dp=n // (t * p), tp=t, pp=p, recompute="full", dtype="fp16", flash_attention=False)
    pr = predict(shape, lay, cluster("dgx-a100", nodes=n // 8), global_batch=B, method="megatron")
    with capsys.disabled():
        print(f"\nSC21 {name:>6}: predicted HFU {pr.hfu:.1%} (MFU {pr.mfu:.1%}) vs published {published}% of peak "
              f"({pr.hfu * 312:.0f} vs {tflops} TFLOP/s per GPU); "
              f"bubble {pr.bubble_s / pr.step_s:.1%}, TP {pr.exposed_s.get('tp', 0) / pr.step_s:.1%}, "
              f"{pr.memory['total'] / 2**30:.0f} GiB", end="")
    assert abs(pr.hfu * 100 - published) <= 10
    assert pr.fits


# ------------------------------------------------------------ Llama 3 405B (Dubey et al. 2024), Table 4
LLAMA3 = [(8192, 1, 64, 8192, 43), (16384, 1, 128, 8192, 41), (16384, 16, 8, 131072, 38)]


@pytest.mark.parametrize("gpus, cp, dp, seq, published", LLAMA3, ids=["8K", "16K", "16K-cp16"])
def test_llama3_405b_table4_within_10_points(gpus, cp, dp, seq, published, capsys):
    """Table 4: TP8, PP16, 16M tokens per batch, BF16 MFU 43/41/38%. Assumptions: 50% achievable,
    interleaved schedule with v = 4 (not published; v = 2 lands 5 points lower), micro-batch 1, ZeRO-2
    ("FSDP" sharding optimizer states and gradients, §3.3.2), sequence parallelism, flash attention,
    126 layers over 16 stages (8 on the slowest)."""
    lay = Layout(dp=dp, tp=8, pp=16, cp=cp, strategy="zero2", schedule="interleaved", virtual_stages=4,
                 sequence_parallel=True)
    pr = predict("llama3-405b", lay, cluster("dgx-h100", nodes=gpus // 8), global_batch=2**24 // seq, seq_len=seq)
    with capsys.disabled():
        print(f"\nLlama 3 405B {gpus} GPUs cp{cp}: predicted MFU {pr.mfu:.1%} vs published {published}%; "
              f"{pr.tokens_per_s_per_gpu * pr.model_flops_per_token / 1e12:.0f} TFLOP/s per GPU; "
              f"bubble {pr.bubble_s / pr.step_s:.1%}", end="")
    assert abs(pr.mfu * 100 - published) <= 10


def test_expert_and_context_parallel_simple_models():
    """EP shards the experts (memory falls ~ep-fold for Mixtral) and adds all-to-alls; CP adds K/V
    all-gathers and splits the activations by the sequence."""
    c = cluster("dgx-h100", nodes=1)
    one = predict("mixtral-8x7b", Layout(dp=8, strategy="zero1"), c, global_batch=64)
    ep = predict("mixtral-8x7b", Layout(dp=8, ep=8, strategy="zero1"), c, global_batch=64)
    assert ep.memory["model_states"] < one.memory["model_states"] / 4 and ep.comm_s["ep"] > 0 and "ep" not in one.comm_s
    kw = dict(global_batch=8, seq_len=32768)
    flat = predict("llama3-8b", Layout(dp=8, tp=8, strategy="zero1"), cluster("dgx-h100"), **kw)
    cp = predict("llama3-8b", Layout(dp=4, cp=2, tp=8, strategy="zero1"), cluster("dgx-h100"), **kw)
    assert cp.comm_s["cp"] > 0 and cp.memory["activations"] < flat.memory["activations"]
    assert "CP (simple model)" in " ".join(cp.assumptions)


def test_a_cluster_priced_with_links_fitted_to_nccl_tests_tables():
    """Issue #15: a cluster's links from a parsed nccl-tests table. The course's SYNTHETIC tables were
    generated from known fabrics (labkit.comm.synthetic), so the fits must give those fabrics back."""
    from pathlib import Path

    from labkit import comm
    from labkit.comm.synthetic import fabric

    root = Path(__file__).resolve().parents[1] / "datasets" / "comm"
    read = lambda name: comm.parse((root / name).read_text())[1]            # noqa: E731
    intra = read("nccl_tests_all_reduce_h100_nvlink_8gpu.SYNTHETIC.txt").fit()
    inter = read("nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt").fit()
    h100, eth = fabric("h100-nvlink-node"), fabric("pcie-2node-25gbe")
    assert intra.nranks == 8 and 1 / intra.beta_s_per_byte == pytest.approx(h100.intra_bw, rel=0.05)
    assert inter.nranks == 16 and 1 / inter.beta_s_per_byte == pytest.approx(eth.inter_bw, rel=0.05)
    fitted = cluster("a100-25gbe").with_links(inter=inter)
    assert fitted.inter_bw == pytest.approx(1 / inter.beta_s_per_byte) and fitted.intra_bw == 300e9
    assert fitted.inter_alpha_s == pytest.approx(inter.alpha_s) and "inter-node link fitted" in fitted.description
    lay = Layout(dp=64, strategy="zero1", micro_batch=1)
    line = predict("llama3-8b", lay, cluster("a100-25gbe"), global_batch=512, seq_len=2048)
    meas = predict("llama3-8b", lay, fitted, global_batch=512, seq_len=2048)
    assert meas.comm_s["dp"] > line.comm_s["dp"]              # 93 % of line rate: the fitted link is slower
    both = cluster("dgx-h100").with_links(intra=intra)
    assert both.intra_bw == pytest.approx(1 / intra.beta_s_per_byte) and both.inter_bw == cluster("dgx-h100").inter_bw
    with pytest.raises(ValueError, match="intra was fitted on 16 ranks, more than a node's 8 GPUs"):
        cluster("a100-25gbe").with_links(intra=inter)
    with pytest.raises(ValueError, match="inter was fitted on 8 ranks, within one node"):
        cluster("a100-25gbe").with_links(inter=intra)
    with pytest.raises(ValueError, match="needs intra= or inter="):
        cluster("a100-25gbe").with_links()
    with pytest.raises(TypeError, match="must be a labkit.comm.AlphaBeta"):
        cluster("a100-25gbe").with_links(inter=3e9)
    table = read("nccl_tests_all_reduce_h100_nvlink_8gpu.SYNTHETIC.txt")
    with pytest.raises(ValueError, match="place='both'"):
        table.fit("both")
    with pytest.raises(ValueError, match="at least 2 sizes"):
        replace(table, rows=table.rows.iloc[:1]).fit()
    with pytest.raises(ValueError, match="does not say its op"):
        replace(table, op=None).fit()
