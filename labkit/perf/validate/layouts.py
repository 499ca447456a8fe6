"""Parallel layouts on live gloo ranks against the performance model's counting: what each rank holds
and which collectives one step issues (chapter 24).

- :func:`probe_layout_state` — a :func:`labkit.train.train` probe: the parameters, gradients and AdamW
  state this rank holds, counted from the optimizer's parameter groups (a TP shard's local part, only
  this rank's pipeline stage). The optimizer is the one list that always holds every trained tensor:
  torch's TP+DDP bridge takes the DTensor shards out of ``model.parameters()`` before DDP wraps them.
- :func:`trace_collectives` — the ``gloo:*`` (``nccl:*`` on GPUs) collectives of each rank's profiled step,
  counted by type.
- :func:`predicted_collectives` — the counts the model behind :func:`labkit.perf.predict` prices: Megatron's
  4 all-reduces per block and micro-batch for TP (Shoeybi et al. 2019 §3: 2 forward, 2 backward), and
  2·v·m activation/gradient transfers per pipeline rank (one send or receive per micro-batch, virtual
  stage and direction; Narayanan et al. 2021 §2.2); apart, the vocabulary-parallel ends' all-reduces
  (``vocab_parallel``, :mod:`labkit.train.tensor_parallel`): 1 per micro-batch where the embedding is (its
  partial lookups summed), 4 where the head is (the loss's max, sum of exponentials and target logit;
  the head input's gradient in backward).
- :func:`held_params` — the parameters per rank the model assumes (everything ÷ tp·pp, embeddings split
  evenly) next to the rule of labkit's GPT (the blocks' linear layers split by TP, and the tied
  embedding/head on the vocabulary with ``vocab_parallel``; the first pipeline stage holds the embeddings,
  the last a copy of the tied head).

Taught in chapter 24 (choosing a parallel layout).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

__all__ = ["probe_layout_state", "trace_collectives", "predicted_collectives", "held_params"]


_BACKENDS = ("gloo:", "nccl:")      # the process groups' record_function titles (ProcessGroupGloo / NCCL)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def probe_layout_state(model, optimizer, cfg) -> dict:
    """This rank's parameter count and bytes of parameters, gradients and optimizer state, as it holds them
    (a :func:`labkit.train.train` probe, run after the last optimizer step). Taught in chapter 24."""
    import torch
    import torch.distributed as dist

    params = list(dict.fromkeys(p for g in optimizer.param_groups for p in g["params"]))
    state = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    p, g, o = _bytes(params), _bytes(p.grad for p in params), _bytes(state)
    return {"rank": dist.get_rank() if dist.is_initialized() else 0,
            "n_params": sum(_local(q).numel() for q in params),
            "params": p, "grads": g, "optimizer": o, "model_states": p + g + o}


def trace_collectives(folder) -> dict:
    """``{rank: Counter({"all_reduce": n, "send": n, "recv": n, …})}``: the ``gloo:*`` (or ``nccl:*``) spans of
    each rank's chrome trace (``rank<k>.json``) in ``folder`` — one profiled step with ``profile_steps=1``.
    Taught in chapter 24."""
    folder = Path(folder)
    files = sorted(folder.glob("rank*.json"))
    if not files:
        raise ValueError(f"folder={str(folder)!r} holds no rank*.json trace: run the config with "
                         "profile_dir=… and profile_steps=1")
    out = {}
    for f in files:
        if not f.stem[4:].isdigit():
            continue
        events = json.loads(f.read_text()).get("traceEvents", [])
        out[int(f.stem[4:])] = Counter(str(e["name"]).split(":", 1)[1] for e in events
                                       if e.get("ph") == "X" and str(e.get("name", "")).startswith(_BACKENDS))
    return dict(sorted(out.items()))


def predicted_collectives(cfg) -> dict:
    """Collectives per rank and step that the layout's model parallelism issues, by the papers' counts:
    ``tp_all_reduce`` = 4 · blocks per stage · m (tp > 1, no sequence parallelism), ``pp_send`` =
    ``pp_recv`` = v · m (pp > 1), m = ``cfg.accum`` micro-batches; with tp > 1 and ``vocab_parallel``,
    ``tp_vocab_all_reduce`` = 5·m when one stage holds both ends (pp = 1: the embedding's 1, the loss's 3 and
    the head input gradient's 1 per micro-batch), else ``tp_vocab_all_reduce_first`` = m and
    ``tp_vocab_all_reduce_last`` = 4·m for the ranks of the first and last stage. Taught in chapter 24."""
    from labkit.train import TrainConfig

    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"predicted_collectives needs a TrainConfig, got {type(cfg).__name__}")
    if cfg.sequence_parallel:
        raise ValueError("sequence_parallel=True is not valid here: it replaces each all-reduce by a "
                         "reduce-scatter + all-gather pair; count those with trace_collectives")
    m, blocks = cfg.accum, cfg.model_config.n_layers
    out = {}
    if cfg.tp > 1:
        out["tp_all_reduce"] = 4 * (blocks // cfg.pp) * m
        if cfg.vocab_parallel and cfg.pp == 1:
            out["tp_vocab_all_reduce"] = 5 * m
        elif cfg.vocab_parallel:
            out["tp_vocab_all_reduce_first"], out["tp_vocab_all_reduce_last"] = m, 4 * m
    if cfg.pp > 1:
        out["pp_send"] = out["pp_recv"] = cfg.virtual_stages * m
    return out


def held_params(cfg) -> dict:
    """Parameters per rank for ``cfg``'s tp and pp: ``"model"`` — the performance model's assumption
    (all ÷ tp·pp); ``"blocks split"`` — labkit's GPT as the trainer splits it, for the rank that holds the
    most (TP splits the blocks' linear weights and column-split biases, and with ``vocab_parallel`` the tied
    token embedding/head by vocabulary rows; norms, row-split biases and the position embedding stay whole;
    with pp the first stage holds the embeddings, the last the tied head's copy).
    Taught in chapter 24."""
    import torch

    from labkit.model.gpt import GPT
    from labkit.train.pipeline import split_layers

    with torch.device("meta"):
        gpt = GPT(cfg.model_config)
    total = sum(p.numel() for p in gpt.parameters())

    def block(b):
        n = 0
        for name, p in b.named_parameters():
            split = name.endswith("weight") and p.dim() == 2 or name in ("attn.qkv.bias", "mlp.fc.bias")
            n += p.numel() // cfg.tp if split else p.numel()
        return n

    per_block = [block(b) for b in gpt.blocks]
    tied = gpt.tok_emb.weight.numel() // (cfg.tp if cfg.tp > 1 and cfg.vocab_parallel else 1)
    emb = tied + gpt.pos_emb.weight.numel()
    tail = sum(p.numel() for n, p in gpt.named_parameters() if n.startswith("ln_f"))
    spans = split_layers(len(per_block), cfg.pp)
    stages = []
    for k, (a, b) in enumerate(spans):
        n = sum(per_block[a:b])
        n += emb if k == 0 else 0
        if k == len(spans) - 1:
            n += tail + (tied if cfg.pp > 1 else 0)
        stages.append(n)
    return {"model": total / (cfg.tp * cfg.pp), "blocks split": max(stages), "stages": stages, "total": total}
