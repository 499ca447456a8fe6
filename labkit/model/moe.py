"""A mixture-of-experts MLP for the reference GPT: top-k router, E experts, optional expert parallelism.

:class:`MoE` replaces a block's :class:`labkit.model.gpt.MLP` when ``GPTConfig.n_experts`` ≥ 2 (chapter 26):

- **router**: a bias-free ``Linear(d, E)``; softmax over the E logits gives each token's probabilities, the
  ``top_k`` largest are kept and renormalised to sum to 1 (the gates) — Shazeer et al. 2017 route with a
  top-k softmax; Mixtral (Jiang et al. 2024, §2.1) renormalises the kept ones as here;
- **experts**: E copies of the dense MLP (``d → d_ff → d``, GELU); token t's output is
  ``Σ_{e ∈ topk(t)} gate_e(t) · expert_e(x_t)`` — ``labkit.flops`` counts exactly this: ``top_k`` expert MLPs
  per token plus the router's 2·d·E (``GPTConfig.shape()`` passes ``n_experts``/``top_k`` on);
- **auxiliary load-balancing loss** (Switch Transformers, Fedus et al. 2022, eq. 4–6): ``E · Σ_i f_i · P_i``
  on this layer's tokens (f counted, P differentiable; :mod:`labkit.model.expert_load`); the GPT adds
  ``aux_loss_coef ×`` the sum over layers to its loss;
- **counts**: the token copies routed to each (global) expert are summed into ``counts`` during training
  forwards; :func:`labkit.train.expert_parallel.take_counts` reads and clears them once per step.

Dispatch: the N·k token copies are sorted by expert, each expert runs once on its contiguous slice (an
expert with no tokens still runs, on an empty slice, so every parameter gets a gradient — DDP needs that),
and the outputs are scattered back and weighted by the gates.

**Expert parallelism** (``group`` set by :func:`labkit.train.expert_parallel.shard_experts`): this rank keeps
experts ``[r·E/ep, (r+1)·E/ep)`` of the ``ep`` ranks of its group. Per forward, three ``all_to_all_single``:
the counts per expert (E integers: how many rows each rank will send each other rank), the **dispatch** of the
token copies to the ranks that own their experts, and the **combine** that returns the expert outputs. The two
token exchanges are :class:`AllToAll`, an autograd Function whose backward is the reverse all-to-all (the
gradients travel back along the same splits), so backward costs two more. Each rank still computes its own
tokens' router, gates and attention; only expert inputs and outputs travel.

Taught in chapter 26 (long sequences and MoE).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits, differentiable: forward sends ``in_splits[r]`` rows of ``x`` to
    rank r and receives ``out_splits[r]`` rows from it; backward sends the gradients back the same way
    (out/in swapped). Works on gloo and NCCL. Taught in chapter 26."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (list(out_splits), list(in_splits)), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        with torch.profiler.record_function("comm:all_to_all"):
            dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        with torch.profiler.record_function("comm:all_to_all"):
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x, out_splits, in_splits, group=None):
    """Differentiable uneven all-to-all of the rows of ``x`` (:class:`AllToAll`). Taught in chapter 26."""
    return AllToAll.apply(x, out_splits, in_splits, group)


class MoE(nn.Module):
    """Top-k routed mixture of ``cfg.n_experts`` experts, each built by ``make_expert()`` (the GPT passes its
    dense MLP; see the module docstring). Taught in chapter 26."""

    def __init__(self, cfg, make_expert):
        super().__init__()
        if cfg.n_experts < 2:
            raise ValueError(f"MoE needs n_experts ≥ 2, got {cfg.n_experts}")
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(make_expert() for _ in range(cfg.n_experts))   # labkit.model.gpt.MLP
        self.first_expert = 0          # global index of experts[0] (expert parallelism: r·E/ep)
        self.group = None              # the expert-parallel process group (None: every expert here)
        self.aux = None                # this forward's balance loss (a differentiable scalar)
        # a plain tensor, not a buffer: DDP would overwrite a buffer with rank 0's before every forward
        self.counts = torch.zeros(cfg.n_experts, dtype=torch.long)
        self.sent_rows = 0             # token copies sent to other ranks since the last take_counts

    def route(self, h):
        """(gates (N, k), expert indices (N, k), router probabilities (N, E)) of the tokens ``h`` (N, d)."""
        probs = F.softmax(self.router(h).float(), dim=-1)
        gates, idx = probs.topk(self.top_k, dim=-1)
        return gates / gates.sum(dim=-1, keepdim=True), idx, probs

    def _run_experts(self, rows, per_expert: list[int]):
        outs = [expert(chunk) for expert, chunk in zip(self.experts, rows.split(per_expert), strict=True)]
        return torch.cat(outs) if outs else rows

    def forward(self, x):
        B, T, C = x.shape
        h = x.reshape(-1, C)
        gates, idx, probs = self.route(h)
        flat = idx.reshape(-1)                                   # N·k expert ids, token-major
        counts = torch.bincount(flat, minlength=self.n_experts)
        frac = counts.float() / flat.numel()
        self.aux = self.n_experts * (frac * probs.mean(dim=0)).sum()   # Switch: E · Σ f_i · P_i
        if self.training and torch.is_grad_enabled():
            self.counts = self.counts.to(counts.device) + counts.detach()
        order = flat.argsort(stable=True)                        # copies grouped by expert
        token = order // self.top_k
        rows = h[token]
        if self.group is None:
            y = self._run_experts(rows, counts.tolist())
        else:
            y = self._expert_parallel(rows, counts)
        y = y * gates.reshape(-1)[order].unsqueeze(1).to(y.dtype)
        out = torch.zeros_like(h).index_add(0, token, y.to(h.dtype))
        return out.view(B, T, C)

    def _expert_parallel(self, rows, counts):
        """Send each row to the rank owning its expert, run the local experts, send the results back."""
        ep = dist.get_world_size(self.group)
        local = self.n_experts // ep
        recv_counts = torch.empty_like(counts)                   # [source rank, local expert]
        with torch.profiler.record_function("comm:all_to_all"):
            dist.all_to_all_single(recv_counts, counts, group=self.group)
        send = counts.view(ep, local).sum(dim=1).tolist()
        recv_matrix = recv_counts.view(ep, local)
        recv = recv_matrix.sum(dim=1).tolist()
        me = dist.get_rank(self.group)
        self.sent_rows += sum(send) - send[me]
        got = all_to_all(rows, recv, send, self.group)           # dispatch: source-major, expert-minor
        segment = torch.repeat_interleave(torch.arange(ep * local, device=rows.device), recv_counts)
        regroup = (segment % local * ep + segment // local).argsort(stable=True)   # → expert-major
        y = self._run_experts(got[regroup], recv_matrix.sum(dim=0).tolist())
        back = torch.empty_like(y).index_copy(0, regroup, y)     # source-major again
        return all_to_all(back, send, recv, self.group)          # combine


def moe_layers(model) -> list[MoE]:
    """The :class:`MoE` layers of ``model`` (wrapped or not), in block order. Taught in chapter 26."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def aux_loss(model):
    """Sum over the MoE layers of their last forward's balance loss (0 without MoE). Taught in chapter 26."""
    terms = [m.aux for m in moe_layers(model) if m.aux is not None]
    return sum(terms) if terms else 0.0
