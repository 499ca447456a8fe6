"""Expert parallelism (EP) of the MoE GPT in the one training loop, and the routing record (chapter 26).

**Layout.** EP shares the data-parallel ranks, as in DeepSpeed-MoE (Rajbhandari et al. 2022, §4) and
torchtitan (its ``ep`` dimension borrows ranks from data parallelism): the ``dp`` ranks — every rank here,
EP runs with tp = pp = 1 — are factored as a mesh ``(edp, ep)``, ``ep`` innermost, so ranks
``[g·ep, (g+1)·ep)`` form one expert-parallel group and ranks with the same ``ep`` coordinate form an
expert-data-parallel (``edp``) group of dp/ep ranks. Each rank still reads its own data shard and runs the
whole non-expert model (attention, router, embeddings); of the E experts of every MoE layer it keeps
``E/ep`` (:func:`shard_experts`: ``[c·E/ep, (c+1)·E/ep)`` for ep coordinate c — sliced from the seeded full
model, so the experts are those of the single-process model).

**Gradients.** Non-expert parameters: DDP over all dp ranks as usual (the experts are hidden from DDP with
torch's ``_set_params_and_buffers_to_ignore_for_model``). Expert parameters: backward through the two
all-to-alls (:class:`labkit.model.moe.AllToAll`) already sums onto each expert the gradients of the tokens its ep
group sent it; :func:`reduce_expert_grads` then sums over the edp group (the replicas of the same experts)
and divides by dp — the mean over data-parallel ranks that DDP applies to every other gradient — once per
optimizer step, after the last micro-batch.

**Record.** Every step's tokens per expert (per layer, summed over micro-batches and, once at the end of the
run, over all ranks) and its load imbalance max/mean (:func:`labkit.model.expert_load.load_imbalance`) go to
``record.extra["moe"]`` (:func:`moe_record`), with the token copies this rank sent to other ranks.

Taught in chapter 26 (long sequences and MoE).
"""
from __future__ import annotations

from labkit.model.expert_load import load_imbalance


def ep_mesh(cfg, n: int, device_type: str = "cpu"):
    """The ``(edp, ep)`` device mesh over the ``n`` data-parallel ranks (see the module docstring).
    Taught in chapter 26."""
    from torch.distributed.device_mesh import init_device_mesh

    if n % cfg.ep:
        raise ValueError(f"ep={cfg.ep} must divide the {n} data-parallel ranks (expert parallelism shares them): "
                         f"use a world size that is a multiple of {cfg.ep}")
    return init_device_mesh(device_type, (n // cfg.ep, cfg.ep), mesh_dim_names=("edp", "ep"))


def shard_experts(model, ep_group) -> list[int]:
    """Keep this rank's ``E/ep`` experts in every MoE layer of ``model`` (unwrapped) and route through
    ``ep_group``; returns the global indices of the experts kept. Taught in chapter 26."""
    import torch.distributed as dist
    import torch.nn as nn

    from labkit.model.moe import moe_layers

    ep, me = dist.get_world_size(ep_group), dist.get_rank(ep_group)
    kept = []
    for layer in moe_layers(model):
        if layer.n_experts % ep:
            raise ValueError(f"n_experts={layer.n_experts} is not divisible by ep={ep}: each rank holds E/ep experts")
        local = layer.n_experts // ep
        layer.experts = nn.ModuleList(list(layer.experts)[me * local:(me + 1) * local])
        layer.first_expert, layer.group = me * local, ep_group
        kept = list(range(me * local, (me + 1) * local))
    return kept


def expert_param_names(model) -> list[str]:
    """Names of the expert parameters of ``model`` (those DDP must not all-reduce). Taught in chapter 26."""
    return [name for name, _ in model.named_parameters() if ".experts." in name]


def parallelize_ep(model, cfg, device, n: int):
    """``model`` with its experts split over ep and DDP over the rest (the module docstring).
    Taught in chapter 26."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    mesh = ep_mesh(cfg, n, device.type)
    kept = shard_experts(model, mesh["ep"].get_group())
    DDP._set_params_and_buffers_to_ignore_for_model(model, expert_param_names(model))
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None, bucket_cap_mb=cfg.bucket_cap_mb,
              gradient_as_bucket_view=cfg.gradient_as_bucket_view, static_graph=cfg.static_graph)
    ddp.labkit_ep = {"edp_group": mesh["edp"].get_group(), "dp": n, "experts_here": kept,
                     "ep_rank": dist.get_rank(mesh["ep"].get_group()), "edp": n // cfg.ep}
    return ddp


def reduce_expert_grads(model) -> None:
    """Expert gradients: sum over the edp group, divide by dp (the module docstring). A no-op without EP.
    Taught in chapter 26."""
    import torch.distributed as dist

    info = getattr(model, "labkit_ep", None)
    if info is None:
        return
    inner = getattr(model, "module", model)
    for name, p in inner.named_parameters():
        if ".experts." in name and p.grad is not None:
            if info["edp"] > 1:
                dist.all_reduce(p.grad, group=info["edp_group"])
            p.grad.div_(info["dp"])


def take_counts(model) -> dict:
    """This rank's routing since the last call — ``counts`` (per MoE layer, tokens copies per global expert)
    and ``sent_rows`` (copies sent to other ranks) — and clear them. Taught in chapter 26."""
    from labkit.model.moe import moe_layers

    layers = moe_layers(model)
    out = {"counts": [m.counts.tolist() for m in layers], "sent_rows": sum(m.sent_rows for m in layers)}
    for m in layers:
        m.counts = m.counts.new_zeros(m.counts.shape)
        m.sent_rows = 0
    return out


def after_backward(model, phase) -> dict:
    """Once per optimizer step, after the last micro-batch: expert gradients reduced (phase ``comm``) and
    the step's routing taken (:func:`take_counts`). Taught in chapter 26."""
    if getattr(model, "labkit_ep", None) is not None:
        with phase("comm"):
            reduce_expert_grads(model)
    return take_counts(model)


def moe_record(log: list[dict], model, cfg, n: int) -> dict:
    """``record.extra["moe"]``: per step and layer the tokens per expert summed over all ranks (one
    all-reduce for the whole run) and the load imbalance max/mean; this rank's sent copies and experts.
    Taught in chapter 26."""
    import torch
    import torch.distributed as dist

    counts = torch.tensor([row["counts"] for row in log], dtype=torch.long)        # (steps, layers, E)
    if n > 1:
        dist.all_reduce(counts)
    per_step = counts.tolist()
    imbalance = [[load_imbalance(layer) if sum(layer) else None for layer in step] for step in per_step]
    flat = [v for step in imbalance for v in step if v is not None]
    info = getattr(model, "labkit_ep", None)
    return {"experts": cfg.moe_experts, "top_k": cfg.moe_top_k, "aux_loss_coef": cfg.moe_aux_loss, "ep": cfg.ep,
            "edp": info["edp"] if info else n, "experts_here": info["experts_here"] if info else
            list(range(cfg.moe_experts)), "tokens_per_expert": per_step, "imbalance": imbalance,
            "imbalance_max": max(flat) if flat else None,
            "imbalance_mean": sum(flat) / len(flat) if flat else None,
            "sent_rows": [row["sent_rows"] for row in log]}


def layer_parity(n_experts: int = 4, top_k: int = 2, tokens: int = 32, d_model: int = 32, seed: int = 0) -> dict:
    """Run on every rank of a launch (its world is one ep group): one MoE layer split over the ranks against
    the same layer whole on this process, on the same global batch (``tokens`` per rank, seeded). Returns the
    largest absolute differences of the outputs, of the input gradients, and of the expert and router
    gradients (the router's summed over ranks, as DDP would), with the counts and rows exchanged.
    Taught in chapter 26 (EP equals the same MoE on one process)."""
    import torch
    import torch.distributed as dist

    from labkit.model.config import GPTConfig
    from labkit.model.gpt import MLP
    from labkit.model.moe import MoE

    n, rank = dist.get_world_size(), dist.get_rank()
    cfg = GPTConfig(n_layers=1, d_model=d_model, n_heads=1, vocab_size=8, seq_len=tokens, n_experts=n_experts,
                    top_k=top_k)
    torch.manual_seed(seed)
    whole, split = MoE(cfg, lambda: MLP(cfg)), MoE(cfg, lambda: MLP(cfg))
    split.load_state_dict(whole.state_dict())
    x_all = torch.randn(n, 1, tokens, d_model, generator=torch.Generator().manual_seed(seed + 1))
    w_all = torch.randn(n, 1, tokens, d_model, generator=torch.Generator().manual_seed(seed + 2))
    x_ref = x_all.clone().requires_grad_(True)
    ref = torch.cat([whole(x_ref[r]) for r in range(n)])          # one process: every rank's tokens
    (ref * w_all.squeeze(1)).sum().backward()
    kept = shard_experts(split, dist.group.WORLD)
    x = x_all[rank].clone().requires_grad_(True)
    out = split(x)
    (out * w_all[rank]).sum().backward()
    router_grad = split.router.weight.grad.clone()
    dist.all_reduce(router_grad)
    expert_err = max((a.grad - b.grad).abs().max().item()
                     for j, e in enumerate(kept)
                     for a, b in zip(split.experts[j].parameters(), whole.experts[e].parameters(), strict=True))
    counts = split.counts.clone()
    dist.all_reduce(counts)
    return {"out": (out - ref[rank]).abs().max().item(), "input_grad": (x.grad - x_ref.grad[rank]).abs().max().item(),
            "expert_grad": expert_err, "router_grad": (router_grad - whole.router.weight.grad).abs().max().item(),
            "experts_here": kept, "counts": counts.tolist(), "counts_whole": whole.counts.tolist(),
            "sent_rows": split.sent_rows, "imbalance": load_imbalance(counts.tolist())}
