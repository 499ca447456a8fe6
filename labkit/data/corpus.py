"""The course corpus, its token file, a packed token dataset and a DataLoader factory.

Corpus: the King James Version of the Bible (public domain; Debian package ``bible-kjv-text``; see
``datasets/corpus/README.md``), 1,189 chapters, 4.2 M characters, shipped gzip-compressed with a
byte-level BPE tokenizer (vocabulary 4096) trained on it. The token file (uint16, ≈ 1.2 M tokens,
≈ 2.4 MB) is **not shipped**: :func:`load_tokens` builds it on first use into
``labkit.paths.work_dir("corpus")`` (≈ 3 s), deterministically (same input bytes → same tokens; the
file name carries a hash of the inputs, so a changed corpus never reuses a stale file) and atomically
(temp file + rename, safe when several processes build at once), then memory-maps it.

Sequence packing: documents are concatenated, each followed by the end-of-text token, and cut into
contiguous windows of ``seq_len + 1`` tokens (inputs and next-token targets) — no padding, every
token is trained on (as in GPT-2/nanoGPT data preparation).

Classes here are importable on purpose: DataLoader workers started with spawn/forkserver (and ranks
started by :func:`labkit.launch`) cannot unpickle classes defined in a notebook.

Taught in chapter 22 (data pipelines: workers, pinning, prefetch, data-loader stalls).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CORPORA = {"default": "kjv", "kjv": "kjv"}
EOS = "<|endoftext|>"


def _corpus_files(name: str) -> tuple[Path, Path]:
    if name not in CORPORA:
        raise ValueError(f"corpus name={name!r} is not known; choose one of {sorted(CORPORA)}")
    from labkit.paths import dataset

    stem = CORPORA[name]
    return dataset("corpus", f"{stem}.txt.gz"), dataset("corpus", "tokenizer.json")


def tokenizer(name: str = "default"):
    """The corpus's byte-level BPE tokenizer (a ``tokenizers.Tokenizer``). Taught in chapter 22."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(_corpus_files(name)[1]))


def vocab_size(name: str = "default") -> int:
    """Vocabulary size of the corpus tokenizer (4096 for the shipped corpus). Taught in chapter 22."""
    path = _corpus_files(name)[1]
    return len(json.loads(path.read_text())["model"]["vocab"])


def documents(name: str = "default") -> list[str]:
    """The corpus documents (chapters), separated by blank lines in the shipped file.

    Taught in chapter 22 (data pipelines)."""
    text_path, _ = _corpus_files(name)
    with gzip.open(text_path, "rt", encoding="utf-8") as f:
        return [d for d in f.read().split("\n\n") if d.strip()]


def token_file(name: str = "default") -> Path:
    """Path of the uint16 token file, building it if needed (see the module docstring).

    Taught in chapter 22 (data pipelines)."""
    text_path, tok_path = _corpus_files(name)
    h = hashlib.sha256(text_path.read_bytes() + tok_path.read_bytes()).hexdigest()[:12]
    from labkit.paths import work_dir

    out = work_dir("corpus") / f"{CORPORA[name]}-{h}.u16.bin"
    if out.exists():
        return out
    tok = tokenizer(name)
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise ValueError(f"{tok_path} has no {EOS} token")
    ids: list[int] = []
    for enc in tok.encode_batch(documents(name)):
        ids.extend(enc.ids)
        ids.append(eos)
    arr = np.asarray(ids, dtype=np.uint16)
    if tok.get_vocab_size() > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"vocabulary {tok.get_vocab_size()} does not fit uint16")
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(arr.tobytes())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load_tokens(name: str = "default") -> np.memmap:
    """The corpus as a read-only memory-mapped uint16 array of token ids (documents end with EOS).

    Taught in chapter 22 (data pipelines).
    """
    return np.memmap(token_file(name), dtype=np.uint16, mode="r")


class TokenDataset(Dataset):
    """Packed next-token windows: item i = (tokens[i·T : i·T+T], tokens[i·T+1 : i·T+T+1]) as int64.

    ``tokens`` is a 1-D integer array (e.g. :func:`load_tokens`); a memory map is pickled by its file
    name (workers reopen it), not copied. Taught in chapter 22 (data pipelines).
    """

    def __init__(self, tokens, seq_len: int):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len={seq_len!r} is not valid; use an int ≥ 1")
        tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
        if len(tokens) < seq_len + 1:
            raise ValueError(f"seq_len={seq_len} needs at least {seq_len + 1} tokens, got {len(tokens)}")
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int):
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} windows")
        i %= len(self)
        s = i * self.seq_len
        w = torch.from_numpy(np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64))
        return w[:-1], w[1:]

    def __getstate__(self):
        d = dict(self.__dict__)
        fn = getattr(self.tokens, "filename", None)
        if isinstance(self.tokens, np.memmap) and fn:
            d["tokens"] = ("memmap", str(fn), self.tokens.dtype.str, int(self.tokens.offset))
        return d

    def __setstate__(self, d):
        t = d["tokens"]
        if isinstance(t, tuple) and t and t[0] == "memmap":
            d["tokens"] = np.memmap(t[1], dtype=np.dtype(t[2]), mode="r", offset=t[3])
        self.__dict__.update(d)


def document_lengths(tokens, eos: int) -> np.ndarray:
    """Length in tokens of each document of a packed token array (each document ends with ``eos``,
    counted in its length; a trailing piece without one counts as a document). Taught in chapter 22."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array, got shape {tokens.shape}")
    ends = np.flatnonzero(tokens == eos) + 1
    if ends.size == 0 or ends[-1] != tokens.size:
        ends = np.append(ends, tokens.size)
    return np.diff(np.concatenate([[0], ends])).astype(np.int64)


class PaddedDataset(Dataset):
    """One document per row, **not packed**: each document's next-token pairs are cut into rows of
    ``seq_len``; the last row of a document is padded — inputs with ``pad_id``, targets with ``-100``
    (``torch.nn.functional.cross_entropy``'s default ``ignore_index``, so padding costs compute but no
    loss). The alternative to :class:`TokenDataset`'s packing; :meth:`real_tokens` counts what is not
    padding. Taught in chapter 22 (sequence packing, padding waste).
    """

    def __init__(self, tokens, seq_len: int, eos: int, pad_id: int | None = None):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len={seq_len!r} is not valid; use an int ≥ 1")
        self.tokens = tokens
        self.seq_len = seq_len
        self.pad_id = int(eos if pad_id is None else pad_id)
        lengths = document_lengths(np.asarray(tokens), eos)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        pairs = lengths - 1                                   # next-token pairs inside each document
        keep = pairs > 0
        rows = -(-pairs[keep] // seq_len)
        doc_start = np.repeat(starts[keep], rows)
        first_row = np.repeat(np.cumsum(rows) - rows, rows)
        k = np.arange(rows.sum()) - first_row                 # row number within its document
        self.row_start = (doc_start + k * seq_len).astype(np.int64)
        self.row_real = np.minimum(seq_len, np.repeat(pairs[keep], rows) - k * seq_len).astype(np.int64)

    def __len__(self) -> int:
        return int(self.row_start.size)

    def real_tokens(self) -> int:
        """Target positions that are real tokens (not padding), over all rows."""
        return int(self.row_real.sum())

    def __getitem__(self, i: int):
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} rows")
        i %= len(self)
        s, n = int(self.row_start[i]), int(self.row_real[i])
        w = np.asarray(self.tokens[s:s + n + 1], dtype=np.int64)
        x = torch.full((self.seq_len,), self.pad_id, dtype=torch.int64)
        y = torch.full((self.seq_len,), -100, dtype=torch.int64)
        x[:n] = torch.from_numpy(w[:-1])
        y[:n] = torch.from_numpy(w[1:])
        return x, y

    __getstate__ = TokenDataset.__getstate__
    __setstate__ = TokenDataset.__setstate__


class OnTheFlyDataset(Dataset):
    """Next-token windows tokenised **on the fly**: item i tokenises a span of the corpus text (the
    documents joined by the end-of-text token) starting at character ``i × chars_per_window`` and keeps
    its first ``seq_len + 1`` tokens — the work a pre-tokenised token file (:func:`load_tokens`) does
    once, done in every ``__getitem__``. The same kind of windows as :class:`TokenDataset` (cut points
    differ: a span may start inside a word). Taught in chapter 22 (token file vs tokenising on the fly).
    """

    def __init__(self, seq_len: int, name: str = "default"):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len={seq_len!r} is not valid; use an int ≥ 1")
        self.name, self.seq_len = name, seq_len
        self.text = EOS.join(documents(name)) + EOS
        per_token = len(self.text) / len(load_tokens(name))
        self.chars_per_window = max(1, int(per_token * seq_len))
        self._tok = None
        if len(self) < 1:
            raise ValueError(f"seq_len={seq_len} is longer than the corpus")

    def __len__(self) -> int:
        return (len(self.text) - 4 * self.chars_per_window) // self.chars_per_window

    def __getitem__(self, i: int):
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} windows")
        i %= len(self)
        if self._tok is None:
            self._tok = tokenizer(self.name)
        s, span = i * self.chars_per_window, 2 * self.chars_per_window
        while True:
            ids = self._tok.encode(self.text[s:s + span]).ids
            if len(ids) > self.seq_len or s + span >= len(self.text):
                break
            span *= 2
        w = torch.tensor(ids[:self.seq_len + 1], dtype=torch.int64)
        if w.numel() < self.seq_len + 1:
            raise IndexError(f"window {i} runs past the end of the corpus")
        return w[:-1], w[1:]

    def __getstate__(self):
        return {**self.__dict__, "_tok": None}


class SlowDataset(Dataset):
    """Wraps a dataset and sleeps ``slowdown_s`` in every ``__getitem__``.

    What it simulates, honestly: per-sample *latency* in the loader (slow decode, remote storage,
    augmentation) that does not use the CPU — a sleep releases the core, so more workers hide it
    almost perfectly. A CPU-bound decode would also compete with the training threads for cores;
    this wrapper does not model that. Taught in chapter 22 (data-loader stalls).
    """

    def __init__(self, dataset: Dataset, slowdown_s: float):
        if not slowdown_s >= 0:
            raise ValueError(f"slowdown_s={slowdown_s!r} is not valid; use seconds ≥ 0")
        self.dataset = dataset
        self.slowdown_s = float(slowdown_s)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        time.sleep(self.slowdown_s)
        return self.dataset[i]


def make_loader(dataset: Dataset, batch_size: int, *, num_workers: int = 0, pin_memory: bool = False,
                prefetch_factor: int | None = None, persistent_workers: bool = False,
                slowdown_s: float = 0.0, shuffle: bool = True, seed: int = 0,
                distributed: bool | None = None, drop_last: bool = True,
                multiprocessing_context: str | None = None, num_replicas: int | None = None,
                rank: int | None = None) -> DataLoader:
    """A DataLoader over ``dataset`` with the knobs of chapter 22 exposed.

    Sampling always goes through a ``DistributedSampler`` (``num_replicas=1`` when not distributed), so
    the global batch of step k is the same set of windows for 1 process with batch W·b and for W ranks
    with batch b each (rank r takes every W-th index of one seeded permutation). ``distributed=None``
    means "yes when torch.distributed is initialised with more than one rank"; ``num_replicas``/``rank``
    override the world (under tensor/pipeline parallelism only the data-parallel ranks split the data,
    chapter 24). Workers start with
    ``forkserver`` where available (``spawn`` elsewhere) — forking a process that has run matmuls can
    deadlock (PLATFORM_NOTES) — unless ``multiprocessing_context`` says otherwise.

    The forkserver is asked to import torch and this module once (``set_forkserver_preload``, before it
    starts): each worker is then a fork of a process that has imported torch but run nothing, and starts
    in milliseconds instead of importing torch afresh (seconds each on a loaded machine, chapter 22).
    ``pin_memory=True`` without CUDA is passed on: torch warns and pins nothing.

    Taught in chapter 22 (workers, pin_memory, prefetch_factor, persistent workers).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid; use an int ≥ 1")
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers={num_workers!r} is not valid; use an int ≥ 0")
    if prefetch_factor is not None and num_workers == 0:
        raise ValueError(f"prefetch_factor={prefetch_factor} needs num_workers > 0 (got num_workers=0)")
    if prefetch_factor is not None and (isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int)
                                        or prefetch_factor < 1):
        raise ValueError(f"prefetch_factor={prefetch_factor!r} is not valid; use an int ≥ 1 (batches each worker "
                         "keeps ready) or None")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers=True needs num_workers > 0 (got num_workers=0)")
    import torch.distributed as dist

    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if num_replicas is not None:
        if not isinstance(num_replicas, int) or num_replicas < 1 or not isinstance(rank, int) \
                or not 0 <= rank < num_replicas:
            raise ValueError(f"num_replicas={num_replicas!r}, rank={rank!r} is not valid; use an int ≥ 1 and "
                             "0 ≤ rank < num_replicas")
        replicas = num_replicas if distributed else 1
        rank = rank if distributed else 0
    else:
        replicas, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    if len(dataset) < batch_size * replicas:
        raise ValueError(f"dataset has {len(dataset)} samples, fewer than one global batch "
                         f"(batch_size={batch_size} × {replicas} ranks)")
    ds = SlowDataset(dataset, slowdown_s) if slowdown_s else dataset
    sampler = DistributedSampler(ds, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=True)
    kw = {}
    if num_workers > 0:
        import multiprocessing as mp

        ctx = multiprocessing_context or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        if ctx == "forkserver" and multiprocessing_context is None:
            _preload_forkserver()
        kw.update(multiprocessing_context=ctx, persistent_workers=persistent_workers,
                  prefetch_factor=prefetch_factor if prefetch_factor is not None else 2)
    return DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=pin_memory, drop_last=drop_last, **kw)


def _preload_forkserver() -> None:
    """Ask the (not yet started) forkserver to import torch and labkit.data once; no effect once it runs."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
        mp.set_forkserver_preload(["torch", "labkit.data"])
