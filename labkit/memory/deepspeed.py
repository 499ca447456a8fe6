"""DeepSpeed's ZeRO-2 / ZeRO-3 model-state memory estimators, re-derived, beside labkit's own accounting.

DeepSpeed users size a run with ``estimate_zero2_model_states_mem_needs_all_{live,cold}``
(``deepspeed/runtime/zero/stage_1_and_2.py``) and ``estimate_zero3_model_states_mem_needs_all_{live,cold}``
(``deepspeed/runtime/zero/stage3.py``). Those print one row per offload option: bytes per CPU (the host
of a node) and per GPU. This module redoes that arithmetic (written anew from reading those functions,
DeepSpeed at commit 38327e07, 2025-02-21) so that its figures print identically, and
:func:`compare_with_labkit` explains why they differ from :func:`labkit.memory.estimate.model_state_bytes`.

With Ψ total parameters, L parameters in the largest layer (module), g GPUs per node, n nodes,
N = g·n GPUs and buffer factor f (default 1.5, applied to CPU bytes only):

ZeRO-2 (optimizer states and gradients partitioned, fp16 parameters replicated):

- optimizer offloaded to CPU: GPU 2Ψ (fp16 parameters); CPU Ψ·max(4N, 16)·f;
- no offload: GPU 2Ψ + ⌊18Ψ/N⌋ — DeepSpeed's 18 bytes per parameter are 2 (fp16 gradients) + 4 (fp32
  gradients) + 4 (fp32 master parameters) + 8 (Adam momentum and variance); CPU Ψ·4g·f (loading the
  fp32 checkpoint on every GPU process of a node). DeepSpeed before v0.14.3 (PR #5099, June 2024)
  charged 4Ψ + ⌊16Ψ/N⌋ here; its documentation's printed example (``docs/code-docs/source/memory.rst``,
  t5-3b on 1 node × 8 GPUs) was made with that formula: ``legacy=True`` reproduces it.

ZeRO-3 (parameters partitioned too; the largest layer is gathered whole: 4L bytes — DeepSpeed gives no breakdown;
our reading: its fp16 parameters and fp16 gradients):

- parameters and optimizer offloaded: GPU 4L; CPU Ψ·18·f/n with ``zero_init``, else Ψ·max(4g, 18/n)·f;
- optimizer offloaded only: GPU 4L + ⌊2Ψ/N⌋; CPU Ψ·16·f/n with ``zero_init``, else Ψ·max(4g, 16/n)·f;
- no offload: GPU 4L + ⌊18Ψ/N⌋; CPU L·4g·f with ``zero_init``, else Ψ·4g·f.

DeepSpeed truncates each figure to whole bytes and prints bytes / 2^30 — GiB — labelled "GB".
Taught in chapter 13 (memory anatomy) and chapter 20 (FSDP / ZeRO).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks
from labkit.memory.estimate import model_state_bytes
from labkit.units import GIB

__all__ = ["DeepSpeedRow", "DeepSpeedEstimate", "deepspeed_zero2_estimate", "deepspeed_zero3_estimate",
           "deepspeed_params", "compare_with_labkit"]


@dataclass(frozen=True)
class DeepSpeedRow:
    """One option row of a DeepSpeed estimate: bytes per CPU (node host) and per GPU.

    ``offload_param`` and ``zero_init`` are None for ZeRO-2 (DeepSpeed prints no such column there).
    Taught in chapter 20 (FSDP / ZeRO).
    """

    offload_optimizer: bool
    offload_param: bool | None
    zero_init: bool | None
    cpu_bytes: int
    gpu_bytes: int

    def options(self) -> str:
        """The options column as DeepSpeed prints it ("cpu" padded to 4 characters)."""
        dev = lambda on: "cpu " if on else "none"        # noqa: E731 - f"{OffloadDeviceEnum.cpu:4}"
        if self.offload_param is None:
            return f"offload_optimizer={dev(self.offload_optimizer)}"
        return (f"offload_param={dev(self.offload_param)}, offload_optimizer={dev(self.offload_optimizer)}, "
                f"zero_init={1 if self.zero_init else 0}")

    def line(self) -> str:
        """The row as DeepSpeed prints it: GiB values, labelled "GB"."""
        return f" {self.cpu_bytes / GIB:7.2f}GB | {self.gpu_bytes / GIB:6.2f}GB | {self.options()}"


@dataclass(frozen=True)
class DeepSpeedEstimate:
    """All option rows of a DeepSpeed ZeRO-2 or ZeRO-3 estimate and the setup they are for.

    Taught in chapter 20 (FSDP / ZeRO).
    """

    stage: int
    total_params: float
    largest_layer_params: float
    num_gpus_per_node: int
    num_nodes: int
    additional_buffer_factor: float
    rows: tuple

    def report(self) -> str:
        """The text DeepSpeed's ``..._all_cold`` / ``..._all_live`` print, line for line."""
        nodes = "nodes" if self.num_nodes > 1 else "node"
        gpus = "GPUs" if self.num_gpus_per_node > 1 else "GPU"
        sw = f"SW: Model with {int(self.total_params / 1e6)}M total params"
        sw += (f", {int(self.largest_layer_params / 1e6)}M largest layer params." if self.stage == 3 else ".")
        head = ["Estimated memory needed for params, optim states and gradients for a:",
                f"HW: Setup with {self.num_nodes} {nodes}, {self.num_gpus_per_node} {gpus} per node.", sw,
                "  per CPU  |  per GPU |   Options"]
        return "\n".join(head + [r.line() for r in self.rows])


def _setup(total_params, num_gpus_per_node, num_nodes, additional_buffer_factor):
    psi = checks.positive("total_params", total_params)        # DeepSpeed takes floats (2851e6) too
    g = checks.count("num_gpus_per_node", num_gpus_per_node)
    n = checks.count("num_nodes", num_nodes)
    f = checks.positive("additional_buffer_factor", additional_buffer_factor)
    return psi, g, n, f


def _bytes(name: str, value: float, **inputs) -> int:
    return int(checks.finite_result(name, value, **inputs))


def deepspeed_zero2_estimate(total_params, num_gpus_per_node: int = 1, num_nodes: int = 1,
                             additional_buffer_factor: float = 1.5, *, legacy: bool = False) -> DeepSpeedEstimate:
    """DeepSpeed's ZeRO-2 estimate (``estimate_zero2_model_states_mem_needs_all_cold``): rows for the
    optimizer offloaded to CPU and not. Pass :func:`deepspeed_params` of a model for the ``_all_live``
    variant; ``legacy=True`` uses DeepSpeed's formula before v0.14.3 (4Ψ + 16Ψ/N without offload).
    Taught in chapter 13 (memory anatomy) and chapter 20 (FSDP / ZeRO).
    """
    psi, g, n, f = _setup(total_params, num_gpus_per_node, num_nodes, additional_buffer_factor)
    legacy = checks.flag("legacy", legacy)
    gpus = g * n
    rows = []
    for offload in (True, False):      # DeepSpeed's row order
        # stage_1_and_2.py, estimate_zero2_model_states_mem_needs
        if offload:
            gpu = 2 * psi
            cpu = psi * max(4 * gpus, 16) * f
        else:
            gpu = 4 * psi + int(16 * psi / gpus) if legacy else 2 * psi + int(18 * psi / gpus)
            cpu = psi * 4 * g * f
        rows.append(DeepSpeedRow(offload, None, None, _bytes("cpu bytes", cpu, total_params=total_params),
                                 _bytes("gpu bytes", gpu, total_params=total_params)))
    return DeepSpeedEstimate(2, psi, 0.0, g, n, f, tuple(rows))


def deepspeed_zero3_estimate(total_params, largest_layer_params, num_gpus_per_node: int = 1,
                             num_nodes: int = 1, additional_buffer_factor: float = 1.5) -> DeepSpeedEstimate:
    """DeepSpeed's ZeRO-3 estimate (``estimate_zero3_model_states_mem_needs_all_cold``): rows for
    (offload_param, offload_optimizer, zero_init) in DeepSpeed's order. Taught in chapter 13 and chapter 20.
    """
    psi, g, n, f = _setup(total_params, num_gpus_per_node, num_nodes, additional_buffer_factor)
    big = checks.nonneg("largest_layer_params", largest_layer_params)
    if big > psi:
        raise ValueError(f"largest_layer_params={largest_layer_params!r} is not valid: use a number <= "
                         f"total_params={total_params!r}")
    gpus, per_node = g * n, 1 / n
    layer = 4 * big                     # the gathered largest layer: fp16 parameters + fp16 gradients
    rows = []
    for opt, par in ((True, True), (True, False), (False, False)):
        for zi in (True, False):
            # stage3.py, estimate_zero3_model_states_mem_needs
            if opt and par:
                gpu = layer
                cpu = psi * (18 * per_node if zi else max(4 * g, 18 * per_node)) * f
            elif opt:
                gpu = layer + int(2 * psi / gpus)
                cpu = psi * (16 * per_node if zi else max(4 * g, 16 * per_node)) * f
            else:
                gpu = layer + int(18 * psi / gpus)
                cpu = (big if zi else psi) * 4 * g * f
            rows.append(DeepSpeedRow(opt, par, zi, _bytes("cpu bytes", cpu, total_params=total_params),
                                     _bytes("gpu bytes", gpu, total_params=total_params)))
    return DeepSpeedEstimate(3, psi, big, g, n, f, tuple(rows))


def deepspeed_params(model) -> tuple[int, int]:
    """(total parameters, parameters of the largest module) the way DeepSpeed's ``_all_live`` counts them:
    shared tensors once (by storage pointer); a module's own parameters, not its children's.
    Taught in chapter 20 (FSDP / ZeRO).
    """
    if not (hasattr(model, "parameters") and hasattr(model, "modules")):
        raise checks.ArgumentTypeError(f"model must be an nn.Module, got {type(model).__name__} {model!r:.60}")
    total = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return int(total), int(largest)


def compare_with_labkit(total_params, num_gpus_per_node: int = 1, num_nodes: int = 1, *, stage: int = 3,
                        largest_layer_params=0) -> dict:
    """DeepSpeed's no-offload GPU figure beside labkit's ``model_state_bytes`` (ZeRO paper accounting,
    ``precision="bf16_mixed"``, Adam) for the same stage and GPU count, with the difference explained.

    labkit counts 2 + 2 + 12 = 16 bytes per parameter (ZeRO paper §3.1); DeepSpeed's estimator counts 18
    for the partitioned states (its extra fp32 gradient copy), and for ZeRO-3 also 4 bytes per parameter
    of the gathered largest layer. Both are bytes; DeepSpeed prints them in GiB as "GB".
    Taught in chapter 13 (memory anatomy) and chapter 20 (FSDP / ZeRO).
    """
    checks.one_of("stage", stage, (2, 3))
    if stage == 2:
        ds = deepspeed_zero2_estimate(total_params, num_gpus_per_node, num_nodes)
    else:
        ds = deepspeed_zero3_estimate(total_params, largest_layer_params, num_gpus_per_node, num_nodes)
    row = next(r for r in ds.rows if not r.offload_optimizer and r.zero_init is not False)
    gpus = ds.num_gpus_per_node * ds.num_nodes
    psi = ds.total_params
    ours = model_state_bytes(int(round(psi)), strategy=f"zero{stage}", n_ranks=gpus, precision="bf16_mixed",
                             optimizer="adam").model_states
    if stage == 2:
        parts = {"fp32 gradient copy, partitioned (4 bytes/param / N)": 4 * psi / gpus}
        reason = ("DeepSpeed's ZeRO-2 estimator charges 2Ψ (fp16 params, replicated) + 18Ψ/N, its 18 bytes being "
                  "2 fp16 grads + 4 fp32 grads + 4 fp32 master params + 8 Adam moments; labkit (ZeRO paper §3.1) "
                  "charges 2Ψ + (2 + 12)Ψ/N: no fp32 gradient copy")
    else:
        parts = {"18 vs 16 bytes/param, partitioned (2 bytes/param / N)": 2 * psi / gpus,
                 "gathered largest layer (4 bytes/param of it)": 4 * ds.largest_layer_params}
        reason = ("DeepSpeed's ZeRO-3 estimator charges 18Ψ/N (the same 18 bytes per parameter as its ZeRO-2) + "
                  "4 bytes per parameter of the largest layer, gathered whole; labkit (ZeRO paper §3.1) charges "
                  "(2 + 2 + 12)Ψ/N and counts gathered layers as buffers (comm_buffer_bytes)")
    return {"stage": stage, "n_gpus": gpus, "deepspeed_gpu_bytes": row.gpu_bytes, "labkit_bytes": ours,
            "difference_bytes": row.gpu_bytes - ours, "explained": parts,
            "reason": reason + ". The buffer factor (1.5) applies to DeepSpeed's CPU bytes only, and DeepSpeed "
                               "prints GiB (2^30 bytes) labelled 'GB'; labkit.memory.fmt_bytes names the unit."}
