"""CPU offload of the model states (FSDP2 ``CPUOffloadPolicy``): the bytes it moves per step, when it pays,
and the mechanism measured on live ranks.

**What the policy does** (PyTorch, ``torch.distributed.fsdp.CPUOffloadPolicy``,
https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html): each rank's parameter *shards*, their
gradients and the optimizer state live in host memory; a shard is copied host → device before each of its
all-gathers (``FSDPParam.all_gather_inputs``: ``.to(device, non_blocking=True)``), the reduce-scattered
gradient shard is copied device → host in backward, and the optimizer step runs on the CPU against
host-resident Adam state — which never crosses the link. Per rank and step, with Ψ_r = this rank's share
of the parameters::

    GPU bytes freed   (p + g + o)·Ψ_r           (fp32 AdamW: 4 + 4 + 8 = 16 bytes per parameter)
    host → device     p·Ψ_r × all-gathers       (2 per micro-batch with reshard_after_forward=True, else 1)
    device → host     g·Ψ_r                     (once per optimizer step: the reduced gradient shard)
    CPU Adam          ≈ 28 bytes per parameter of host memory traffic (fp32: read p, g, m, v; write p, m, v)

**When it pays.** The copies take ``bytes / PCIe`` and the CPU step ``Adam bytes / host bandwidth``; the step's
compute takes ``FLOPs per token × tokens per rank / (peak × MFU)``. Both sides scale with Ψ_r, so the
overhead share depends on the tokens each rank processes per step, not on the model's size: offload pays
when it lets a job fit (or fit a larger micro-batch) and the rank's tokens per step are large enough that
the copies hide or stay a small share — :func:`offload_pays` gives that break-even. PCIe line rates per
direction, x16 (PCI-SIG): Gen3 15.75 GB/s, Gen4 31.5 GB/s, Gen5 63 GB/s (8 / 16 / 32 GT/s × 16 lanes ×
128/130); real copies from pageable memory reach far less, pinned memory ≈ 80-90 % (``pin_memory=True``,
the default, which a CPU-only build cannot honour: labkit passes ``pin_memory=False`` there, PLATFORM_NOTES).

Taught in chapter 21 (activation checkpointing and offload).
"""
from __future__ import annotations

import math

import pandas as pd

from labkit import checks

__all__ = ["HOST_LINKS", "ADAM_HOST_BYTES", "offload_bytes_per_step", "offload_pays", "probe_offload",
           "measure_offload"]

GBS = 1e9
#: host link of a catalogued GPU: (PCIe generation, GB/s per direction, x16 line rate). Sources: NVIDIA
#: datasheets (V100: PCIe Gen3; A100: PCIe Gen4 64 GB/s bidirectional; H100/H200: PCIe Gen5 128 GB/s
#: bidirectional) and PCI-SIG's per-lane rates.
HOST_LINKS = {"V100-SXM2-16GB": (3, 15.75), "V100-PCIe-16GB": (3, 15.75), "A100-SXM-80GB": (4, 31.5),
              "A100-PCIe-80GB": (4, 31.5), "H100-SXM": (5, 63.0), "H100-PCIe": (5, 63.0), "H200-SXM": (5, 63.0)}
#: fp32 AdamW's host memory traffic per parameter: read p, g, m, v and write p, m, v (7 × 4 bytes)
ADAM_HOST_BYTES = 28


def _psi(n_params) -> float:
    if hasattr(n_params, "parameters"):
        return float(sum(p.numel() for p in dict.fromkeys(n_params.parameters())))
    return float(checks.positive("n_params", n_params))


def offload_bytes_per_step(n_params, *, n_ranks: int = 1, param_bytes: int = 4, grad_bytes: int = 4,
                           optimizer_bytes: int = 8, accum: int = 1, reshard_after_forward: bool = True) -> dict:
    """Bytes one rank moves per optimizer step under ``CPUOffloadPolicy`` and the GPU bytes it frees (see the
    module docstring). ``n_params``: a count Ψ or an ``nn.Module``; the rank holds Ψ/``n_ranks``. Default
    bytes: fp32 parameters and gradients, AdamW's two fp32 moments. Taught in chapter 21."""
    psi = _psi(n_params) / checks.count("n_ranks", n_ranks)
    p, g, o = (checks.count(n, v, at_least=0) for n, v in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes),
                                                            ("optimizer_bytes", optimizer_bytes)))
    gathers = checks.count("accum", accum) * (2 if checks.flag("reshard_after_forward", reshard_after_forward) else 1)
    h2d, d2h = p * psi * gathers, g * psi
    return {"params_per_rank": psi, "gathers_per_step": gathers, "h2d_bytes": h2d, "d2h_bytes": d2h,
            "moved_bytes": h2d + d2h, "gpu_bytes_freed": (p + g + o) * psi, "optimizer_moved_bytes": 0.0,
            "cpu_adam_bytes": ADAM_HOST_BYTES * psi}


def offload_pays(device: str, n_params, *, tokens_per_rank: float, n_ranks: int = 1, flops_per_token=None,
                 mfu: float = 0.4, dtype: str = "bf16", link_efficiency: float = 0.8, host_bw: float = 100e9,
                 budget_share: float = 0.1, overlap: bool = False, **bytes_kw) -> dict:
    """Time the offload costs one rank per step on ``device`` (a catalogued GPU with a :data:`HOST_LINKS` entry)
    against the step's compute, and the break-even: the tokens per rank per step at which the overhead is
    ``budget_share`` of the compute. ``flops_per_token`` defaults to 6Ψ; ``link_efficiency`` × the PCIe line
    rate is what the copies reach; ``host_bw`` the host memory bandwidth the CPU Adam step gets (an
    assumption: ≈ 100 GB/s of a server socket shared by its GPUs' optimizer steps); ``overlap`` hides the copies
    under compute (FSDP2 issues them ahead of the all-gathers), leaving the CPU step exposed. Taught in chapter 21.
    """
    from labkit.hardware.catalogue import lookup_peak

    checks.one_of("device", device, HOST_LINKS)
    tokens = checks.positive("tokens_per_rank", tokens_per_rank)
    mfu = checks.fraction("mfu", mfu, open_low=True)
    eff = checks.fraction("link_efficiency", link_efficiency, open_low=True)
    host_bw = checks.positive("host_bw", host_bw)
    share = checks.positive("budget_share", budget_share)
    overlap = checks.flag("overlap", overlap)
    psi_all = _psi(n_params)
    fpt = 6.0 * psi_all if flops_per_token is None else checks.positive("flops_per_token", flops_per_token)
    b = offload_bytes_per_step(psi_all, n_ranks=n_ranks, **bytes_kw)
    gen, line = HOST_LINKS[device]
    link = line * GBS * eff
    peak = lookup_peak(device, dtype)
    copy_s = b["moved_bytes"] / link
    adam_s = b["cpu_adam_bytes"] / host_bw
    compute_s = fpt * tokens / (peak * mfu)
    exposed = adam_s + (max(0.0, copy_s - compute_s) if overlap else copy_s)
    per_token = fpt / (peak * mfu)                          # compute seconds per token of this rank
    fixed = adam_s + (0.0 if overlap else copy_s)
    breakeven = fixed / (share * per_token)
    if overlap:                                              # the copies must also fit under the compute
        breakeven = max(breakeven, copy_s / per_token)
    return {"device": device, "pcie": f"Gen{gen} x16, {line:g} GB/s per direction", "link_bytes_per_s": link,
            "peak_flops": peak, **b, "copy_s": copy_s, "cpu_adam_s": adam_s, "compute_s": compute_s,
            "exposed_s": exposed, "overhead": exposed / compute_s, "breakeven_tokens_per_rank": math.ceil(breakeven),
            "pays": exposed <= share * compute_s,
            "assumptions": [f"copies at {eff:.0%} of the PCIe Gen{gen} x16 line rate ({line:g} GB/s per direction)",
                            f"CPU AdamW at {host_bw / GBS:g} GB/s of host memory traffic, {ADAM_HOST_BYTES} B/param",
                            f"compute at MFU {mfu:.0%} of the {dtype} peak {peak / 1e12:g} TFLOP/s",
                            "copies overlapped with compute" if overlap else "copies not overlapped (upper bound)"]}


# ------------------------------------------------------------------------------------------ live mechanism
def probe_offload(cfg, measured_steps: int = 1) -> dict:
    """One rank's measurement of FSDP2 offload (``cfg.parallel="fsdp"``): trains a warm-up step and
    ``measured_steps`` steps with the trainer's own model and ``forward_backward``, counting every shard
    FSDP2 fetches for an all-gather (``FSDPParam.all_gather_inputs``, where an offloaded shard is copied
    host → device) and its bytes; then where each state lives and its exact bytes. Taught in chapter 21."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    from labkit.memory.knobs import fsdp_probe_start
    from labkit.memory.tensors import measure_model_state
    from labkit.train.loop import forward_backward

    model, opt, it, device = fsdp_probe_start(cfg, "offload")
    fetched = {"shards": 0, "bytes": 0, "offloaded": 0}
    real = FSDPParam.all_gather_inputs

    def counted(self):
        fetched["shards"] += 1
        fetched["bytes"] += self._sharded_param_data.numel() * self._sharded_param_data.element_size()
        fetched["offloaded"] += int(self.offload_to_cpu)
        return real.fget(self)

    FSDPParam.all_gather_inputs = property(counted)
    try:
        for _ in range(measured_steps):
            forward_backward(model, it, cfg, device)
            opt.step()
            opt.zero_grad(set_to_none=False)          # keep the gradient shards to locate and count them
    finally:
        FSDPParam.all_gather_inputs = real
    params = list(dict.fromkeys(model.parameters()))
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    grads = [p.grad for p in params if p.grad is not None]
    opt_t = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim()]
    devices = {"params": sorted({str(t.device) for t in local}),
               "grads": sorted({str((g.to_local() if hasattr(g, "to_local") else g).device) for g in grads}),
               "optimizer": sorted({str((v.to_local() if hasattr(v, "to_local") else v).device) for v in opt_t})}
    states = measure_model_state(model, opt).as_dict()
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "label": cfg.label,
            "cpu_offload": cfg.cpu_offload, "compute_device": str(device),
            "fetches_per_step": fetched["shards"] / measured_steps,
            "offloaded_fetches_per_step": fetched["offloaded"] / measured_steps,
            "h2d_bytes_per_step": fetched["bytes"] / measured_steps * (fetched["offloaded"] > 0),
            "fetched_bytes_per_step": fetched["bytes"] / measured_steps,
            "d2h_bytes_per_step": states["grads"] if cfg.cpu_offload else 0.0, "devices": devices,
            "states": states, "n_params_local": sum(t.numel() for t in local)}


def _rank_offload(cfgs, measured_steps):
    return [probe_offload(c, measured_steps) for c in cfgs]


def measure_offload(cfgs, nprocs: int = 2, *, measured_steps: int = 1, timeout_s: float = 300) -> pd.DataFrame:
    """:func:`probe_offload` of each FSDP2 config on ``nprocs`` fresh ranks (one launch), rank 0's rows beside
    :func:`offload_bytes_per_step`'s prediction for the same shards. Taught in chapter 21."""
    from labkit.launcher.parent import launch
    from labkit.model.gpt import GPT

    cfgs = list(cfgs)
    if not cfgs or any(getattr(c, "parallel", None) != "fsdp" for c in cfgs):
        raise ValueError("measure_offload measures FSDP2 configs: give TrainConfigs with parallel='fsdp'")
    checks.count("measured_steps", measured_steps)
    res = launch(_rank_offload, checks.count("nprocs", nprocs, at_least=2), args=(cfgs, measured_steps),
                 timeout_s=timeout_s, stream=False)
    rows = []
    for cfg, r in zip(cfgs, res.values[0], strict=True):
        import torch

        with torch.device("meta"):
            psi = sum(p.numel() for p in dict.fromkeys(GPT(cfg.model_config).parameters()))
        pred = offload_bytes_per_step(psi, n_ranks=nprocs, accum=cfg.accum,
                                      reshard_after_forward=cfg.reshard_after_forward is not False)
        rows.append({"label": r["label"], "cpu_offload": r["cpu_offload"],
                     "shards fetched/step": r["fetches_per_step"],
                     "H2D MB/step": r["h2d_bytes_per_step"] / 1e6,
                     "predicted H2D MB": pred["h2d_bytes"] / 1e6 if cfg.cpu_offload else 0.0,
                     "D2H MB/step": r["d2h_bytes_per_step"] / 1e6,
                     "predicted D2H MB": pred["d2h_bytes"] / 1e6 if cfg.cpu_offload else 0.0,
                     "states on host MB": r["states"]["model_states"] / 1e6 if cfg.cpu_offload else 0.0,
                     "predicted freed MB": pred["gpu_bytes_freed"] / 1e6 if cfg.cpu_offload else 0.0,
                     "params on": ",".join(r["devices"]["params"]), "grads on": ",".join(r["devices"]["grads"]),
                     "Adam state on": ",".join(r["devices"]["optimizer"])})
    return pd.DataFrame(rows)
