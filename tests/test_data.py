"""labkit.data: the shipped corpus, deterministic token file, packing, loader knobs, slowdown."""
from __future__ import annotations

import hashlib
import pickle
import time

import numpy as np
import pytest
import torch

from labkit import data


def test_tokens_are_the_corpus():
    t = data.load_tokens()
    assert t.dtype == np.uint16 and t.ndim == 1 and len(t) > 1_000_000
    assert int(t.max()) < data.vocab_size() == 4096
    tok = data.tokenizer()
    eos = tok.token_to_id(data.EOS)
    assert int((np.asarray(t) == eos).sum()) == len(data.documents()) == 1189    # one EOS per chapter
    first = tok.decode(np.asarray(t[:40]).tolist())
    assert first.startswith("Ge 1\n1 In the beginning God created the heaven and the earth.")


def test_token_file_rebuild_is_deterministic(tmp_path, monkeypatch):
    shipped = data.token_file()
    monkeypatch.setenv("LABKIT_WORK", str(tmp_path))
    rebuilt = data.token_file()
    assert rebuilt.parent == tmp_path / "corpus" and rebuilt.name == shipped.name
    assert hashlib.sha256(rebuilt.read_bytes()).digest() == hashlib.sha256(shipped.read_bytes()).digest()


def test_packed_windows_are_contiguous():
    t = data.load_tokens()
    ds = data.TokenDataset(t, 64)
    assert len(ds) == (len(t) - 1) // 64
    x0, y0 = ds[0]
    x1, _ = ds[1]
    assert x0.dtype == torch.int64 and x0.shape == (64,)
    assert torch.equal(x0[1:], y0[:-1])                       # next-token targets
    assert torch.equal(x1, torch.from_numpy(np.asarray(t[64:128], dtype=np.int64)))   # no gaps, no padding
    assert torch.equal(ds[-1][0], ds[len(ds) - 1][0])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_memmap_pickles_by_name():
    ds = data.TokenDataset(data.load_tokens(), 32)
    blob = pickle.dumps(ds)
    assert len(blob) < 2000                                   # not a 2 MB copy
    assert torch.equal(pickle.loads(blob)[5][0], ds[5][0])


def test_loader_is_seeded_and_workers_give_the_same_batches():
    ds = data.TokenDataset(data.load_tokens(), 32)
    a = [x for x, _ in zip(data.make_loader(ds, 4, seed=3), range(3), strict=False)]
    b = [x for x, _ in zip(data.make_loader(ds, 4, seed=3, num_workers=1, prefetch_factor=2), range(3),
                           strict=False)]
    c = next(iter(data.make_loader(ds, 4, seed=4)))
    for (xa, _), (xb, _) in zip(a, b, strict=True):
        assert torch.equal(xa, xb)
    assert not torch.equal(a[0][0], c[0])


def test_global_batch_is_the_union_of_rank_batches():
    """What make_loader's DistributedSampler guarantees: 1 process × batch W·b = W ranks × batch b."""
    from torch.utils.data import DistributedSampler

    ds = data.TokenDataset(data.load_tokens(), 32)
    W, b = 4, 3
    single = list(DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True))
    ranks = [list(DistributedSampler(ds, num_replicas=W, rank=r, shuffle=True, seed=0, drop_last=True))
             for r in range(W)]
    for step in range(3):
        union = sorted(i for r in range(W) for i in ranks[r][step * b:(step + 1) * b])
        assert union == sorted(single[step * W * b:(step + 1) * W * b])


def test_slowdown_is_a_sleep_per_sample():
    ds = data.TokenDataset(np.arange(1000, dtype=np.uint16), 8)
    loader = data.make_loader(ds, 4, slowdown_s=0.05)
    t0 = time.perf_counter()
    next(iter(loader))
    assert time.perf_counter() - t0 >= 4 * 0.05
    assert isinstance(loader.dataset, data.SlowDataset)


def test_bad_inputs():
    ds = data.TokenDataset(np.arange(100, dtype=np.uint16), 8)
    with pytest.raises(ValueError, match="name='wiki'"):
        data.load_tokens("wiki")
    with pytest.raises(ValueError, match="seq_len=0"):
        data.TokenDataset(np.arange(10), 0)
    with pytest.raises(ValueError, match="needs at least"):
        data.TokenDataset(np.arange(5), 8)
    with pytest.raises(ValueError, match="batch_size=0"):
        data.make_loader(ds, 0)
    with pytest.raises(ValueError, match="prefetch_factor=2 needs num_workers"):
        data.make_loader(ds, 2, prefetch_factor=2)
    with pytest.raises(ValueError, match="persistent_workers"):
        data.make_loader(ds, 2, persistent_workers=True)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        data.make_loader(ds, 64)
    with pytest.raises(ValueError, match="slowdown_s=-1"):
        data.make_loader(ds, 2, slowdown_s=-1)
