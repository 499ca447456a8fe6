"""Batch arithmetic (issue #17): tokens and sequences per step, accumulation steps from a global batch."""
from __future__ import annotations

import numpy as np
import pytest

from labkit.train import batch


def test_tokens_and_sequences_per_step():
    assert batch.sequences_per_step(12, n_ranks=8, accum_steps=5) == 480
    assert batch.tokens_per_step(12, 1024, n_ranks=8, accum_steps=5) == 491_520
    assert batch.tokens_per_step(np.int64(4), 256) == 1024


def test_nanogpt_accumulation_from_total_batch_size():
    """nanoGPT train.py: batch_size 12 × block_size 1024 × 8 GPUs × 5 steps = 491,520 tokens per iteration;
    build-nanogpt: total_batch_size = 2**19 with B=64, T=1024 on 8 GPUs -> grad_accum_steps 1 (on 1 GPU: 8)."""
    assert batch.accum_steps(12, n_ranks=8, seq_len=1024, global_tokens=491_520) == 5
    assert batch.accum_steps(64, n_ranks=8, seq_len=1024, global_tokens=2**19) == 1
    assert batch.accum_steps(64, seq_len=1024, global_tokens=2**19) == 8


def test_llama3_batch_in_tokens():
    """Llama 3 (Dubey et al. 2024 §3.4.1): a 4M-token batch of 4,096-token sequences is 1,024 sequences;
    written as a float 4 * 2**20 or 4194304.0 it is the same count."""
    assert batch.accum_steps(1, n_ranks=1024, seq_len=4096, global_tokens=4 * 2**20) == 1
    assert batch.accum_steps(2, n_ranks=64, seq_len=4096, global_tokens=4194304.0) == 8
    assert batch.accum_steps(2, n_ranks=64, global_sequences=1024) == 8


def test_a_target_that_does_not_divide_names_the_nearest_ones():
    with pytest.raises(ValueError, match=r"global_tokens=500,000 .*98,304 .*491,520 \(5 .*589,824 \(6"):
        batch.accum_steps(12, n_ranks=8, seq_len=1024, global_tokens=500_000)
    with pytest.raises(ValueError, match="global_sequences.*smaller than one micro-step"):
        batch.accum_steps(16, n_ranks=8, global_sequences=64)
    with pytest.raises(ValueError, match="global_tokens"):
        batch.accum_steps(1, seq_len=8, global_tokens=4e6 + 0.5)
    with pytest.raises(ValueError, match="exactly one"):
        batch.accum_steps(1, seq_len=8, global_tokens=64, global_sequences=8)
    with pytest.raises(ValueError, match="exactly one"):
        batch.accum_steps(1, seq_len=8)
    with pytest.raises(ValueError, match="seq_len"):
        batch.accum_steps(1, global_tokens=64)
    with pytest.raises(ValueError, match="micro_batch"):
        batch.tokens_per_step(2.0, 8)


def test_the_sources_case_a_and_case_b():
    """Chapter 15: 16 sequences × 64 GPUs, no accumulation, and 4 × 64 accumulated 4 times: both 1024 sequences."""
    assert batch.sequences_per_step(16, n_ranks=64) == batch.sequences_per_step(4, n_ranks=64, accum_steps=4) == 1024
    assert batch.accum_steps(16, n_ranks=64, global_sequences=1024) == 1
    assert batch.accum_steps(4, n_ranks=64, global_sequences=1024) == 4
    assert batch.tokens_per_step(4, 2048, n_ranks=64, accum_steps=4) == 1024 * 2048
