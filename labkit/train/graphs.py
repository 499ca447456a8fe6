"""CUDA graphs in the trainer (``TrainConfig.cuda_graphs``): capture the model's forward and backward once,
replay them every micro-batch.

A CUDA graph records a sequence of kernels with their arguments; replaying it costs one launch
(``cudaGraphLaunch``) instead of one per kernel, so a step made of many short kernels — a small model, a
small batch — stops waiting for the CPU to launch them (NVIDIA, "Getting Started with CUDA Graphs", 2019,
https://developer.nvidia.com/blog/cuda-graphs/; PyTorch, "Accelerating PyTorch with CUDA Graphs", 2021,
https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/). It does not fuse anything: the same
kernels run, back to back. The price: static shapes and addresses (each replay reads its inputs from the
buffers captured), no CPU synchronisation inside, and memory held by the graph's private pool.

The trainer uses ``torch.cuda.make_graphed_callables`` (https://pytorch.org/docs/stable/generated/
torch.cuda.make_graphed_callables.html) on the whole GPT with a sample micro-batch of the run's shape
(the loader drops the last partial batch, so every micro-batch has it), captured inside the run's
autocast (with ``cache_enabled=False``, as the docs require); the optimizer step stays eager (pair it
with ``optimizer_impl="fused"``). This path runs on a GPU only; its wiring is unit-tested on CPU with
a fake capture (tests/test_fusion.py). Taught in chapter 17.
"""
from __future__ import annotations

import contextlib


def require_cuda(device) -> None:
    """Refuse a run with ``cuda_graphs=True`` on a device that is not CUDA. Taught in chapter 17."""
    if getattr(device, "type", str(device)) != "cuda":
        raise ValueError(f"TrainConfig.cuda_graphs=True needs a CUDA device; this run resolved to {device}. "
                         "Use cuda_graphs=False on CPU (chapter 17 shows a SYNTHETIC GPU trace instead)")


def _make_graphed_callables(model, sample_args):    # the one CUDA call; tests replace it with a fake
    import torch

    return torch.cuda.make_graphed_callables(model, sample_args)


def graph_model(model, cfg, device, autocast=contextlib.nullcontext):
    """``model`` with its forward and backward captured as CUDA graphs for micro-batches of ``cfg``'s shape
    (``cfg.micro_batch`` × ``cfg.seq_len`` token ids), captured inside ``autocast()`` (the run's autocast
    context, built with ``cache_enabled=False``). Returns the graphed model; the loop calls it as before.
    Taught in chapter 17."""
    import torch

    require_cuda(device)
    seq = cfg.model_config.seq_len
    x = torch.zeros((cfg.micro_batch, seq), dtype=torch.long, device=device)
    y = torch.zeros((cfg.micro_batch, seq), dtype=torch.long, device=device)
    with autocast():
        graphed = _make_graphed_callables(model, (x, y))
    graphed.labkit_cuda_graphs = {"sample_shape": [cfg.micro_batch, seq], "captured": True}
    return graphed
