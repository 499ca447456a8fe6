"""Batch arithmetic: tokens and sequences per optimizer step, and accumulation steps per rank.

One optimizer step consumes ``micro_batch`` sequences of ``seq_len`` tokens on each of ``n_ranks``
data-parallel ranks, ``accum_steps`` times (gradient accumulation) before the update::

    sequences per step = micro_batch × n_ranks × accum_steps
    tokens per step    = sequences per step × seq_len

Papers state the *global* batch — Llama 3 (Dubey et al. 2024 §3.4.1) in tokens (4M, then 8M, then
16M), Karpathy's build-nanogpt (``train_gpt2.py``) as ``total_batch_size`` in tokens, from which each rank derives
``grad_accum_steps`` (nanoGPT's ``train.py`` instead fixes ``gradient_accumulation_steps`` and divides it by the ranks).
:func:`accum_steps` does that derivation and refuses a target that does not divide, naming the two
nearest targets that do. Counts may be written as integral floats (``4e6``); tokens are unpadded.

Taught in chapter 4 (tokens per step, the MFU numerator) and chapter 15 (micro-batch and accumulation).
"""
from __future__ import annotations

from labkit import checks

__all__ = ["tokens_per_step", "sequences_per_step", "accum_steps"]


def sequences_per_step(micro_batch: int, *, n_ranks: int = 1, accum_steps: int = 1) -> int:
    """Global sequences per optimizer step: micro_batch × n_ranks × accum_steps.

    Taught in chapter 15 (micro-batch and accumulation).
    """
    return (checks.count("micro_batch", micro_batch) * checks.count("n_ranks", n_ranks)
            * checks.count("accum_steps", accum_steps))


def tokens_per_step(micro_batch: int, seq_len: int, *, n_ranks: int = 1, accum_steps: int = 1) -> int:
    """Global tokens per optimizer step: micro_batch × seq_len × n_ranks × accum_steps.

    Taught in chapter 4 (MFU) and chapter 15 (micro-batch and accumulation).
    """
    return (sequences_per_step(micro_batch, n_ranks=n_ranks, accum_steps=accum_steps)
            * checks.count("seq_len", seq_len))


def accum_steps(micro_batch: int, *, n_ranks: int = 1, seq_len: int | None = None,
                global_tokens: int | None = None, global_sequences: int | None = None) -> int:
    """Accumulation steps per rank that reach a target global batch, given in tokens
    (``global_tokens``, needs ``seq_len``; build-nanogpt's ``total_batch_size``, Llama 3's batch) or in
    sequences (``global_sequences``) — exactly one of them. ValueError when the target is not a whole
    number of micro-steps (micro_batch × n_ranks sequences each), naming the nearest targets that are.

    Taught in chapter 15 (micro-batch and accumulation).
    """
    mb, n = checks.count("micro_batch", micro_batch), checks.count("n_ranks", n_ranks)
    if (global_tokens is None) == (global_sequences is None):
        raise ValueError(f"global_tokens={global_tokens!r}, global_sequences={global_sequences!r}: give exactly "
                         "one target batch (in tokens or in sequences)")
    if global_tokens is not None:
        if seq_len is None:
            raise ValueError(f"global_tokens={global_tokens!r} needs seq_len (tokens per sequence)")
        target, name = checks.whole("global_tokens", global_tokens), "global_tokens"
        per = mb * n * checks.count("seq_len", seq_len)
        how, unit = f"micro_batch × n_ranks × seq_len = {mb} × {n} × {seq_len}", "tokens"
    else:
        if seq_len is not None:
            checks.count("seq_len", seq_len)
        target, name = checks.whole("global_sequences", global_sequences), "global_sequences"
        per = mb * n
        how, unit = f"micro_batch × n_ranks = {mb} × {n}", "sequences"
    steps, rest = divmod(target, per)
    if steps == 0:
        raise ValueError(f"{name}={global_tokens if global_sequences is None else global_sequences!r} is smaller "
                         f"than one micro-step of {how} = {per:,} {unit}: use {name} >= {per:,} or a smaller "
                         "micro_batch")
    if rest:
        raise ValueError(f"{name}={target:,} is not a multiple of {how} = {per:,} {unit} per micro-step: use "
                         f"{steps * per:,} ({steps} accumulation steps) or {(steps + 1) * per:,} ({steps + 1}), "
                         "or change micro_batch")
    return steps
