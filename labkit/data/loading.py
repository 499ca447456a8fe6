"""Measuring the data pipeline: the loader alone, worker counts, epoch restarts, pinning, padding waste.

The rule the chapter tests: a loader keeps up when it produces one batch per training step. With
``w`` worker processes each building whole batches, a batch of ``b`` samples costing ``t`` seconds each
is ready every ``b·t / w`` seconds, so the loader starves the step ``s`` unless

    w ≥ ⌈ b · t / s ⌉                                                      (:func:`workers_needed`)

— for per-sample *latency* (I/O, a remote read, a sleep); CPU-bound decoding also needs the cores.
The source's starting point, CPU cores ÷ GPUs per node (:func:`source_num_workers`), says how many
workers the machine can host, not how many the pipeline needs.

Padding (:func:`padding_waste`): a document of ``L`` tokens has ``L − 1`` next-token pairs; cut one
document per row of ``T`` positions it fills ``⌈(L−1)/T⌉`` rows, the last padded; packing concatenates
documents (end-of-text between them) and cuts ``⌊(N−1)/T⌋`` full rows, losing only the tail.

Taught in chapter 22 (the data pipeline).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from labkit import checks

__all__ = ["source_num_workers", "workers_needed", "LoaderTiming", "time_loader", "sweep_workers",
           "epoch_starts", "pin_memory_probe", "padding_waste", "real_target_share"]


def source_num_workers(cpu_cores: int, gpus_per_node: int) -> int:
    """The source's starting point for ``num_workers``: CPU cores ÷ GPUs per node (rounded down, ≥ 1).

    A ceiling on what one rank can host, not what its pipeline needs (chapter 22's ⚠)."""
    cores = checks.count("cpu_cores", cpu_cores)
    gpus = checks.count("gpus_per_node", gpus_per_node)
    return max(1, cores // gpus)


def workers_needed(sample_s: float, batch_size: int, step_s: float) -> int:
    """Workers that keep a step of ``step_s`` fed when a sample costs ``sample_s`` of latency:
    ⌈batch_size · sample_s / step_s⌉ (0 when samples are free). Taught in chapter 22."""
    t = checks.nonneg("sample_s", sample_s)
    b = checks.count("batch_size", batch_size)
    s = checks.positive("step_s", step_s)
    return math.ceil(b * t / s - 1e-12) if t else 0


@dataclass(frozen=True)
class LoaderTiming:
    """What :func:`time_loader` measured: ``startup_s`` = from ``iter(loader)`` to the first batch
    (worker start-up included), ``steady_s`` = seconds for ``batches`` batches after ``warmup`` more
    were drained (the loader's own pace once every worker runs and the prefetch queue is empty).

    Taught in chapter 22."""

    startup_s: float
    steady_s: float
    batches: int
    warmup: int

    @property
    def s_per_batch(self) -> float:
        return self.steady_s / self.batches

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.steady_s


def time_loader(loader, batches: int = 20, *, warmup: int | None = None, consume_s: float = 0.0) -> LoaderTiming:
    """Time ``batches`` batches of ``loader`` (the loader alone when ``consume_s`` = 0; otherwise the
    consumer sleeps ``consume_s`` per batch, as a training step would take), after the first batch and
    ``warmup`` more (None → num_workers × prefetch_factor: what the workers had queued ahead while the
    first was awaited — counting them would credit the loader with work done during start-up).

    Taught in chapter 22 (the loader alone)."""
    batches = checks.count("batches", batches)
    consume_s = checks.nonneg("consume_s", consume_s)
    if warmup is None:
        warmup = getattr(loader, "num_workers", 0) * (getattr(loader, "prefetch_factor", None) or 0)
    warmup = checks.count("warmup", warmup, at_least=0)
    t0 = time.perf_counter()
    it = iter(loader)
    got = 0
    try:
        next(it)
        got += 1
        t1 = time.perf_counter()
        for _ in range(warmup):
            next(it)
            got += 1
        a = time.perf_counter()
        for _ in range(batches):
            if consume_s:
                time.sleep(consume_s)
            next(it)
            got += 1
        b = time.perf_counter()
    except StopIteration:
        raise ValueError(f"the loader ran out after {got} batches; it needs 1 + warmup={warmup} + "
                         f"batches={batches}: ask for fewer or use a bigger dataset") from None
    finally:
        del it
    return LoaderTiming(startup_s=t1 - t0, steady_s=b - a, batches=batches, warmup=warmup)


def sweep_workers(dataset, batch_size: int, workers=(0, 1, 2, 4, 8), *, slowdown_s: float = 0.0,
                  batches: int = 16, seed: int = 0, **loader_kw):
    """The loader alone at each worker count: one row per count with start-up, steady seconds per batch
    and batches/s (:func:`time_loader`) (a ``pandas.DataFrame``). Taught in chapter 22."""
    import pandas as pd

    from labkit import data

    rows = []
    for w in workers:
        w = checks.count("workers", w, at_least=0)
        with warnings.catch_warnings():           # torch's "more workers than suggested" on small machines
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            loader = data.make_loader(dataset, batch_size, num_workers=w, slowdown_s=slowdown_s, seed=seed,
                                      distributed=False, **loader_kw)
            t = time_loader(loader, batches)
        rows.append({"num_workers": w, "startup_s": t.startup_s, "s_per_batch": t.s_per_batch,
                     "batches_per_s": t.batches_per_s})
    return pd.DataFrame(rows)


def epoch_starts(dataset, batch_size: int, *, num_workers: int, persistent_workers: bool, epochs: int = 3,
                 seed: int = 0) -> list[float]:
    """Seconds from the start of each epoch to its first batch, iterating ``epochs`` whole epochs of one
    loader: without ``persistent_workers`` every epoch starts its workers again. Taught in chapter 22."""
    from labkit import data

    epochs = checks.count("epochs", epochs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        loader = data.make_loader(dataset, batch_size, num_workers=num_workers, seed=seed, distributed=False,
                                  persistent_workers=persistent_workers)
        out = []
        for e in range(epochs):
            loader.sampler.set_epoch(e)
            t0 = time.perf_counter()
            it = iter(loader)
            next(it)
            out.append(time.perf_counter() - t0)
            for _ in it:
                pass
            del it
    return out


def pin_memory_probe(dataset, batch_size: int = 2) -> dict:
    """One batch through ``DataLoader(pin_memory=True)``: whether CUDA is present, the warnings torch
    gave, and whether the batch came back pinned (page-locked). Without CUDA torch warns and pins nothing;
    with CUDA the batch is pinned and ``.to("cuda", non_blocking=True)`` copies asynchronously.
    Taught in chapter 22."""
    import torch

    from labkit import data

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = data.make_loader(dataset, batch_size, pin_memory=True, distributed=False)
        x, _ = next(iter(loader))
    pinned = bool(x.is_pinned()) if torch.cuda.is_available() else False
    msgs = [str(w.message) for w in caught if "pin" in str(w.message).lower()]
    return {"cuda": torch.cuda.is_available(), "warnings": msgs, "pinned": pinned}


def padding_waste(lengths, seq_len: int) -> dict:
    """Rows, positions and the share of positions that are padding, for one document per row (padded)
    and for packing, from document lengths in tokens (see the module docstring). Taught in chapter 22."""
    seq_len = checks.count("seq_len", seq_len)
    bad = ValueError(f"lengths={checks.short_repr(lengths)} is not valid: use a non-empty 1-D array of whole "
                     "document lengths ≥ 1 token")
    try:
        raw = np.asarray(lengths)
        objs = np.asarray(lengths, dtype=object).ravel()
    except (TypeError, ValueError):
        raise bad from None
    if any(isinstance(v, (bool, np.bool_)) for v in objs):       # booleans are not lengths
        raise bad
    if raw.dtype.kind not in "iuf" or raw.ndim != 1 or raw.size == 0 or not np.isfinite(raw).all() \
            or (raw != np.round(raw)).any() or (raw < 1).any():
        raise bad
    lengths = raw.astype(np.int64)
    pairs = lengths - 1
    real = int(pairs.sum())
    rows = int(np.sum(-(-pairs // seq_len)))
    total = int(lengths.sum())
    packed_rows = (total - 1) // seq_len
    return {"seq_len": seq_len, "documents": int(lengths.size), "real_targets": real,
            "padded_rows": rows, "padded_positions": rows * seq_len,
            "padding_share": 1 - real / (rows * seq_len) if rows else 0.0,
            "packed_rows": packed_rows, "packed_positions": packed_rows * seq_len,
            "packed_dropped_tail": (total - 1) - packed_rows * seq_len,
            "row_ratio": rows / packed_rows if packed_rows else math.inf}


def real_target_share(loader, batches: int) -> float:
    """Share of target positions in ``batches`` batches of ``loader`` that are real tokens (not the
    ignore index −100): the padding waste as the trainer sees it. Taught in chapter 22."""
    batches = checks.count("batches", batches)
    real = total = 0
    for i, (_, y) in enumerate(loader):
        if i == batches:
            break
        real += int((y != -100).sum())
        total += y.numel()
    if not total:
        raise ValueError("the loader gave no batches")
    return real / total
