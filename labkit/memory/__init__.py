"""Memory per rank: model states, activations and communication buffers — predicted and measured.

- ``estimate.py`` — the models: ZeRO/FSDP model states (Rajbhandari et al. 2020), activations with
  recomputation (Korthikanti et al. 2022), :func:`fmt_bytes`;
- ``buffers.py`` — communication buffers: DDP's gradient buckets, FSDP's unit buffers;
- ``tensors.py`` — exact bytes of live tensors (model state, saved activations);
- ``deepspeed.py`` — DeepSpeed's ZeRO-2/3 estimators (GPU and CPU bytes per offload option), reproduced
  and compared with ``estimate.py``'s accounting;
- ``timeline.py`` — allocated bytes through one training step (forward, backward, optimizer), measured
  with ``torch.profiler``'s memory events;
- ``measure.py`` — predicted vs measured per rank on real ranks of the reference trainer;
- ``sharding.py`` — FSDP units, collectives and bytes per step, parameters held per knob (predicted);
- ``knobs.py`` — the same measured on live FSDP2 ranks (a counting hook, registered parameter bytes);
- ``recompute.py`` — activation-checkpointing policies measured against the models (saved bytes, peak, FLOPs
  executed) and priced (``policy_costs``);
- ``offload.py`` — FSDP2 CPU offload: bytes moved per step, when it pays on a GPU's PCIe link, the mechanism on
  live ranks.

Taught in chapter 13 (memory anatomy), chapter 16 (attention kernels), chapter 20 (FSDP / ZeRO) and chapter 21
(checkpointing).
"""
from labkit.memory.buffers import comm_buffer_bytes, ddp_bucket_sizes
from labkit.memory.deepspeed import (
    DeepSpeedEstimate,
    DeepSpeedRow,
    compare_with_labkit,
    deepspeed_params,
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
)
from labkit.memory.estimate import (
    ATTENTION_STORES,
    GB,
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    GiB,
    MemoryBreakdown,
    activation_bytes,
    attention_saved_bytes,
    canonical_strategy,
    fmt_bytes,
    model_state_bytes,
)
from labkit.memory.knobs import CollectiveCounter, knob_table, measure_knobs, probe_knobs
from labkit.memory.measure import predict_vs_measure, probe_model_state
from labkit.memory.sharding import VOLUME_STRATEGIES, collectives_per_step, n_units, params_held, step_volume
from labkit.memory.tensors import measure_activation_bytes, measure_model_state
from labkit.memory.timeline import StepMemory, StepMemoryRecorder, memory_samples

__all__ = ["GB", "GiB", "STRATEGIES", "PRECISIONS", "OPTIMIZERS", "MemoryBreakdown", "fmt_bytes", "canonical_strategy",
           "model_state_bytes", "activation_bytes", "attention_saved_bytes", "ATTENTION_STORES", "ddp_bucket_sizes", "comm_buffer_bytes",
           "DeepSpeedRow", "DeepSpeedEstimate", "deepspeed_zero2_estimate", "deepspeed_zero3_estimate",
           "deepspeed_params", "compare_with_labkit",
           "measure_model_state", "measure_activation_bytes", "predict_vs_measure", "probe_model_state",
           "StepMemory", "StepMemoryRecorder", "memory_samples",
           "CollectiveCounter", "measure_knobs", "probe_knobs", "knob_table",
           "VOLUME_STRATEGIES", "n_units", "collectives_per_step", "step_volume", "params_held"]
