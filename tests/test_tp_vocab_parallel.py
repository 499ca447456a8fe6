"""The vocabulary-parallel head and loss (chapter 24, labkit.train.tensor_parallel) on real gloo ranks: the tied
embedding/head split on the vocabulary and the cross-entropy under loss_parallel follow the single process's loss
curve, each rank's head does half the FLOPs, and the step issues the all-reduces the model counts."""
from __future__ import annotations

import pytest

from labkit.perf.validate.layouts import predicted_collectives, trace_collectives
from labkit.train import TrainConfig, run_many, train
from labkit.train.tensor_parallel import apply_tensor_parallel, head_flops, head_plan

# fp32, fixed seed, user peak; 8 sequences of 64 tokens per step in every layout (as tests/test_parallel_tp_pp.py)
BASE = TrainConfig(model="tiny", steps=3, warmup_steps=1, peak_flops=1e12, micro_batch=8)
TOL = 2e-5                                               # fp32: other reduction orders, not other maths
VAL = BASE.replace(steps=4, micro_batch=4, val_every=2, train_sequences=512)   # a held-out evaluation every 2 steps


@pytest.fixture(scope="module")
def single():
    return train(BASE).loss


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """2 ranks: the vocabulary-parallel plan, with sequence parallelism, and the older plan with the head whole on
    every rank — every rank's record, with the head_flops probe; then the two plans profiled without the probe
    (its forward would land in the profiled step)."""
    traces = tmp_path_factory.mktemp("vocab_traces")
    cfgs = {"vocab": BASE.replace(tp=2), "vocab_sp": BASE.replace(tp=2, sequence_parallel=True),
            "whole": BASE.replace(tp=2, vocab_parallel=False), "vocab_val": VAL.replace(tp=2)}
    recs = run_many(list(cfgs.values()), 2, timeout_s=300, all_ranks=True, probe=head_flops)
    out = dict(zip(cfgs, recs, strict=True))
    profiled = {f"{k}_traced": cfgs[k].replace(profile_dir=str(traces / k), profile_steps=1) for k in ("vocab", "whole")}
    out.update(zip(profiled, run_many(list(profiled.values()), 2, timeout_s=300, all_ranks=True), strict=True))
    return out


@pytest.mark.parametrize("name", ["vocab", "vocab_sp", "whole"])
def test_split_head_follows_the_single_process(ranks, single, name):
    for rec in ranks[name]:                              # every rank reports the global batch's loss
        assert rec.loss == pytest.approx(single, rel=TOL)
        assert rec.tokens_per_step == 8 * 64 and rec.config["vocab_parallel"] == (name != "whole")


def test_held_out_loss_under_loss_parallel(ranks):
    """Chapter 25's held-out evaluation runs the model's loss too: under loss_parallel, the single process's value."""
    want = [row["val_loss"] for row in train(VAL).extra["val_log"]]
    for rec in ranks["vocab_val"]:
        assert [row["val_loss"] for row in rec.extra["val_log"]] == pytest.approx(want, rel=TOL) and len(want) == 2


def test_each_rank_computes_half_the_head(ranks):
    """FlopCounterMode on each rank's own head matmul (its input × its local weight rows, checked by the probe to
    give that rank's logits): 2·B·T·d·V/tp forward, twice that backward — half the older plan's on each rank."""
    b, t, d, v = 8, 64, 128, 4096
    whole = [r.extra["probe"] for r in ranks["whole"]]
    split = [r.extra["probe"] for r in ranks["vocab"]]
    assert [p["vocab_parallel"] for p in whole + split] == [False, False, True, True]
    assert all(p["head_flops"] == 6 * b * t * d * v and p["logits_local_shape"] == [b, t, v] for p in whole)
    assert all(p["head_flops"] == 6 * b * t * d * v // 2 and p["logits_local_shape"] == [b, t, v // 2]
               for p in split)
    assert sum(p["head_flops"] for p in split) == whole[0]["head_flops"]     # split, not duplicated


def test_profiled_step_issues_the_counted_all_reduces(ranks):
    """Megatron's 4 per block and micro-batch, plus the vocabulary-parallel ends' 5 (the embedding's partial
    lookups; the loss's max, sum of exponentials and target logit; the head input's gradient)."""
    wants = {}
    for name in ("vocab", "whole"):
        pred = predicted_collectives(BASE.replace(tp=2, vocab_parallel=name == "vocab"))
        wants[name] = pred["tp_all_reduce"] + pred.get("tp_vocab_all_reduce", 0)
        counts = trace_collectives(ranks[f"{name}_traced"][0].config["profile_dir"])
        assert sorted(counts) == [0, 1] and all(c["all_reduce"] == wants[name] for c in counts.values())
    assert wants == {"vocab": 4 * 2 + 5, "whole": 4 * 2}                # tiny: 2 blocks, 1 micro-batch


def test_plan_and_bad_input():
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    plan = head_plan(sequence_parallel=False, vocab_parallel=True)
    assert isinstance(plan["tok_emb"], RowwiseParallel) and isinstance(plan["head"], ColwiseParallel)
    assert not plan["head"].use_local_output                     # Shard(-1) logits kept as a DTensor
    assert head_plan(sequence_parallel=False, vocab_parallel=False) == {}
    assert isinstance(head_plan(True, False)["head"], PrepareModuleInput)
    with pytest.raises(ValueError, match="vocab_parallel"):
        TrainConfig(model="tiny", tp=2, vocab_parallel="yes")

    from labkit.model.config import GPTConfig
    from labkit.model.gpt import GPT

    class TwoRanks:                                  # the error is raised before any collective
        def size(self):
            return 2

    odd = GPT(GPTConfig(n_layers=1, d_model=32, n_heads=2, vocab_size=101, seq_len=8))
    with pytest.raises(ValueError, match="vocab_size=101 must be divisible by tp=2"):
        apply_tensor_parallel(odd, TwoRanks())
    with pytest.raises(ValueError, match="unpipelined"):
        head_flops(object(), None, BASE)
