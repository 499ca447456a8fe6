"""A decoder-only GPT (nanoGPT-like) in plain single-device PyTorch.

The model knows nothing about parallelism: DDP, FSDP2 and activation checkpointing are applied from
outside by :mod:`labkit.train`, exactly as a learner would to their own model. Architecture: GPT-2
(Radford et al. 2019) — learned positions, pre-LayerNorm blocks, causal self-attention, GELU MLP of width
``d_ff`` (4·d by default), tied input/output embeddings — as in Karpathy's nanoGPT (github.com/karpathy/nanoGPT,
model.py). Biases are kept (GPT-2); :meth:`GPTConfig.shape` gives the matching
:class:`labkit.flops.ModelShape`, so FLOPs and MFU are computed from the same numbers the model uses.

Attention (chapter 16) is :func:`labkit.kernels.attention.attend`: ``"naive"`` (explicit QKᵀ, mask, softmax, ·V —
the T×T score matrix is materialised), ``"sdpa"`` (``F.scaled_dot_product_attention``, PyTorch picks the
backend) or one backend forced (``"flash"``, ``"math"``, ``"efficient"``, ``"cudnn"``).

With ``n_experts`` ≥ 2 every block's MLP is a top-k mixture of experts (:class:`labkit.model.moe.MoE`, chapter 26).

Taught in chapter 3 (the model whose FLOPs we count) and chapter 16 (attention kernels, recomputation).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as _checkpoint

from labkit.kernels.attention import attend
from labkit.model.config import ATTENTIONS, SIZES, GPTConfig, gpt_config  # noqa: F401 - re-exported
from labkit.model.moe import MoE, aux_loss


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.attention = cfg.attention
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.recompute_core = False   # chapter 21's "attention" policy: recompute QKᵀ, softmax, ·V in backward
        self.context_parallel = None  # chapter 26: (q, k, v) -> y, ring attention over the cp ranks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # -1 heads: under tensor parallelism (chapter 24) this rank's qkv holds n_heads/tp heads of q, k and v
        # (labkit.train.tensor_parallel), so the local head count comes from the width, never from the config
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, -1, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        # labkit.kernels.attention: naive (Vaswani et al. 2017, eq. 1, the T×T scores materialised), sdpa, or one
        # SDPA backend forced through torch.nn.attention.sdpa_kernel
        if self.context_parallel is not None:   # labkit.train.context_parallel: this rank's tokens, keys from the ring
            y = self.context_parallel(q, k, v)
        elif self.recompute_core and torch.is_grad_enabled():   # keep q, k, v; drop what the core saves
            y = _checkpoint(attend, q, k, v, self.attention, causal=True, dropout_p=self.dropout,
                            training=self.training, use_reentrant=False)
        else:
            y = attend(q, k, v, self.attention, causal=True, dropout_p=self.dropout, training=self.training)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)
        return self.drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.ff)
        self.proj = nn.Linear(cfg.ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block; with ``checkpoint`` its activations are recomputed in backward."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MoE(cfg, lambda: MLP(cfg)) if cfg.n_experts else MLP(cfg)   # chapter 26: a top-k mixture of MLPs (labkit.model.moe)
        self.checkpoint = cfg.checkpoint

    def _forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x):
        if self.checkpoint and torch.is_grad_enabled():
            # non-reentrant checkpointing (the recommended mode; works with FSDP2 and torch.compile)
            return _checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class GPT(nn.Module):
    """Decoder-only GPT. ``forward(idx, targets=None) -> (logits, loss)``.

    Taught in chapter 3 (FLOPs of a real model) and chapter 16 (attention variants, recomputation).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT needs a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight   # tied embeddings (GPT-2)
        self.context_parallel = None   # chapter 26: cuts each batch to this rank's tokens (labkit.train.context_parallel)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def n_params(self) -> int:
        """Parameters counted once (the tied embedding once)."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Token + position embeddings of ``idx`` (B, T) → (B, T, d): what the first pipeline stage runs
        before its blocks (chapter 24); ``pos``: the tokens' positions (default 0…T−1; chapter 26's
        context parallelism gives each rank's own)."""
        if pos is None:
            pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tok_emb(idx) + self.pos_emb(pos))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and the (tied) output head: what the last pipeline stage runs after its blocks."""
        return self.head(self.ln_f(x))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.config.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len={self.config.seq_len}")
        pos = None
        if self.context_parallel is not None:     # chapter 26: keep this rank's share of each sequence
            idx, targets, pos = self.context_parallel.shard(idx, targets)
        x = self.embed(idx, pos)
        for block in self.blocks:
            x = block(x)
        logits = self.logits(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
            if self.config.aux_loss_coef:      # chapter 26: Switch's load-balancing loss, summed over MoE layers
                loss = loss + self.config.aux_loss_coef * aux_loss(self)
        return logits, loss
