"""Chapter 22's data pipeline: padded vs packed rows, on-the-fly tokenisation, loader timing, the trainer's
loader options (prefetch_factor, persistent_workers, pin_memory, dataset, packing)."""
from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest
import torch

from labkit import data
from labkit.data import loading as pipeline
from labkit.train import TrainConfig, train

EOS = 0


def _docs_tokens(*lengths):
    """A token array of documents of the given lengths (EOS-terminated), ids 1.. inside documents."""
    out, nxt = [], 1
    for n in lengths:
        out.extend(range(nxt, nxt + n - 1))
        out.append(EOS)
        nxt += n - 1
    return np.asarray(out, dtype=np.int64)


def test_document_lengths():
    t = _docs_tokens(3, 10, 1)
    assert data.document_lengths(t, EOS).tolist() == [3, 10, 1]
    assert data.document_lengths(np.array([5, 6, EOS, 7, 8]), EOS).tolist() == [3, 2]   # an unterminated tail
    with pytest.raises(ValueError, match="non-empty 1-D"):
        data.document_lengths(np.zeros((2, 2)), EOS)


def test_padding_waste_by_hand():
    w = pipeline.padding_waste([3, 10], 4)      # pairs 2 and 9 → rows 1 + 3; packed (13 − 1) // 4 = 3
    assert (w["real_targets"], w["padded_rows"], w["padded_positions"]) == (11, 4, 16)
    assert math.isclose(w["padding_share"], 5 / 16)
    assert (w["packed_rows"], w["packed_dropped_tail"]) == (3, 0)
    assert math.isclose(w["row_ratio"], 4 / 3)
    for bad in ([], [0, 3], [[1, 2]], [3, float("nan")], [3.5], [True, 2], ["3"], None):
        with pytest.raises(ValueError, match="document lengths"):
            pipeline.padding_waste(bad, 4)
    with pytest.raises(ValueError, match="seq_len"):
        pipeline.padding_waste([3], 0)


def test_padded_rows_hold_each_document_once_and_pad_with_the_ignore_index():
    t = _docs_tokens(3, 10, 1, 6)
    ds = data.PaddedDataset(t, 4, EOS)
    w = pipeline.padding_waste(data.document_lengths(t, EOS), 4)
    assert len(ds) == w["padded_rows"] and ds.real_tokens() == w["real_targets"]
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    x, y = torch.stack(xs), torch.stack(ys)
    assert x.shape == (len(ds), 4) and x.dtype == torch.int64
    real = y != -100
    assert int(real.sum()) == ds.real_tokens()
    assert (x[~real] == EOS).all()                       # padded inputs carry the pad id
    # every real (input, target) pair is a next-token pair of one document: targets follow inputs by one id
    # inside a document, and a document's last target is its EOS
    pairs = list(zip(x[real].tolist(), y[real].tolist(), strict=True))
    assert all(b == a + 1 or b == EOS for a, b in pairs)
    assert sum(b == EOS for _, b in pairs) == 3          # the 1-token document has no pair
    assert pipeline.real_target_share(data.make_loader(ds, 1, shuffle=False), len(ds)) == pytest.approx(
        1 - w["padding_share"])


def test_padded_dataset_on_the_memmap_pickles_by_name():
    tokens = data.load_tokens()
    ds = data.PaddedDataset(tokens, 256, data.tokenizer().token_to_id(data.EOS))
    back = pickle.loads(pickle.dumps(ds))
    assert isinstance(back.tokens, np.memmap)
    assert torch.equal(back[7][1], ds[7][1])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_on_the_fly_windows_are_the_corpus_tokenised():
    fly = data.OnTheFlyDataset(32)
    x, y = fly[0]
    assert x.shape == y.shape == (32,) and torch.equal(x[1:], y[:-1])
    tok = data.tokenizer()
    assert tok.decode(x.tolist()).startswith("Ge 1\n1 In the beginning")
    assert torch.equal(fly[len(fly) - 1][0], fly[-1][0])
    back = pickle.loads(pickle.dumps(fly))               # the tokenizer is reloaded, not pickled
    assert back._tok is None and torch.equal(back[3][0], fly[3][0])
    with pytest.raises(ValueError, match="seq_len"):
        data.OnTheFlyDataset(0)


def test_worker_formulas():
    assert pipeline.workers_needed(0.02, 32, 0.1) == 7
    assert pipeline.workers_needed(0.01, 10, 0.1) == 1       # exactly one step of work: 1 worker
    assert pipeline.workers_needed(0.0, 32, 0.1) == 0
    assert pipeline.source_num_workers(112, 8) == 14 and pipeline.source_num_workers(4, 8) == 1
    for bad in (lambda: pipeline.workers_needed(-1, 4, 1), lambda: pipeline.workers_needed(0.1, 0, 1),
                lambda: pipeline.workers_needed(0.1, 4, 0), lambda: pipeline.source_num_workers(8, 0)):
        with pytest.raises(ValueError):
            bad()


def test_time_loader_cannot_beat_the_sleeps_and_says_when_the_loader_runs_out():
    ds = data.TokenDataset(np.arange(200) % 50, 4)
    slow = data.make_loader(ds, 2, slowdown_s=0.01, distributed=False)
    t = pipeline.time_loader(slow, 3)
    assert t.batches == 3 and t.warmup == 0 and t.s_per_batch >= 0.02     # 2 samples × 10 ms of sleep
    assert t.startup_s >= 0.02 and math.isclose(t.batches_per_s, 1 / t.s_per_batch)
    with pytest.raises(ValueError, match="ran out"):
        pipeline.time_loader(data.make_loader(ds, 2, distributed=False), 100)
    with pytest.raises(ValueError, match="batches"):
        pipeline.time_loader(slow, 0)


def test_sweep_and_epoch_restarts_with_real_workers():
    ds = torch.utils.data.Subset(data.TokenDataset(np.arange(400) % 50, 4), range(16))
    sweep = pipeline.sweep_workers(ds, 2, (0, 2), batches=2)
    assert list(sweep["num_workers"]) == [0, 2] and (sweep["batches_per_s"] > 0).all()
    starts = pipeline.epoch_starts(ds, 2, num_workers=1, persistent_workers=True, epochs=2)
    assert len(starts) == 2 and all(s > 0 for s in starts)
    with pytest.raises(ValueError, match="persistent_workers"):
        pipeline.epoch_starts(ds, 2, num_workers=0, persistent_workers=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA behaviour")
def test_pin_memory_without_cuda_warns_and_pins_nothing():
    probe = pipeline.pin_memory_probe(data.TokenDataset(np.arange(100) % 50, 4))
    assert probe == {"cuda": False, "warnings": probe["warnings"], "pinned": False}
    assert probe["warnings"], "torch warns that pin_memory does nothing without an accelerator"


def test_make_loader_checks_prefetch_factor():
    ds = data.TokenDataset(np.arange(100) % 50, 4)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="prefetch_factor"):
            data.make_loader(ds, 2, num_workers=1, prefetch_factor=bad)


@pytest.mark.parametrize("changes, match", [
    ({"prefetch_factor": 2}, "prefetch_factor"),                       # needs workers
    ({"num_workers": 2, "prefetch_factor": 0}, "prefetch_factor"),
    ({"persistent_workers": True}, "persistent_workers"),
    ({"pin_memory": "yes"}, "pin_memory"),
    ({"dataset": "parquet"}, "dataset"),
    ({"packing": False, "dataset": "on_the_fly"}, "packing"),
    ({"packing": 0}, "packing"),
])
def test_trainer_loader_options_are_checked(changes, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**changes)


def test_trainer_runs_each_dataset_and_loader_option():
    base = TrainConfig(model="tiny", seq_len=16, micro_batch=2, steps=2, warmup_steps=1, device="cpu")
    for cfg in (base.replace(packing=False), base.replace(dataset="on_the_fly"),
                base.replace(num_workers=1, prefetch_factor=1, persistent_workers=False)):
        rec = train(cfg)
        assert len(rec.loss) == 2 and all(math.isfinite(v) and v > 0 for v in rec.loss), cfg
    if not torch.cuda.is_available():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rec = train(base.replace(pin_memory=True))
        assert any("pin" in str(w.message).lower() for w in caught)
        assert rec.config["pin_memory"] is True
