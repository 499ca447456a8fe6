"""Fuzz the estimators: every public function refuses nonsense with an error that names the parameter.

For every public callable of the estimator modules (their ``__all__``) this file holds valid baseline
arguments and the *kind* of each parameter. Each test replaces ONE argument with each bad value of its
kind — a wrong type ("1e3", None, a list), a bool where a number is wanted, NaN, ±inf, a negative, a
zero where it means nothing, a float where an int count is wanted, a string like "False" for a flag —
and asserts that labkit raises a ValueError (``checks.ArgumentTypeError`` is one) from its own code whose
message names the parameter: never a raw TypeError/KeyError/ZeroDivisionError/OverflowError/
AttributeError from Python or NumPy, never a NaN, inf or negative result. NumPy scalars must be
ACCEPTED where Python numbers are (with the same result), and extreme-but-finite values (1e300,
1e-300, 2**40) must give a finite result or a labkit ValueError, never an overflow.

A seeded random test then changes several arguments at once (each kept, or given a bad value of its
kind, or any of a pool of garbage values). Everything is deterministic and torch-free; the calls take
well under a second of CPU (``fuzz_case_count()`` says how many).
Measurement functions (they time the device or launch ranks) are listed in ``MEASURES`` and checked
for early refusals separately.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import os
import types
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

import labkit
import labkit.comm.models
import labkit.flops
import labkit.flops.mfu
import labkit.hardware.catalogue
import labkit.integrations
import labkit.kernels.fusion
import labkit.kernels.roofline
import labkit.measure.claims
import labkit.measure.scaling
import labkit.memory.buffers
import labkit.memory.deepspeed
import labkit.memory.estimate
import labkit.model.config
import labkit.model.expert_load
import labkit.model.shapes
import labkit.perf
import labkit.perf.cost
import labkit.perf.gemm
import labkit.perf.scheduling
import labkit.perf.steptime
import labkit.perf.validate.fit
import labkit.perf.validate.stage_times
import labkit.perf.validate.tp_cycle
import labkit.teaching.faults
import labkit.train.batch
import labkit.train.ring_attention
from labkit.comm.models import AlphaBeta
from labkit.flops import ModelShape
from labkit.hardware.catalogue import DeviceSpec
from labkit.model.config import GPTConfig
from labkit.perf.steptime import StepParts

MODULES = [labkit.flops, labkit.model.shapes, labkit.train.batch, labkit.model.config, labkit.flops.mfu, labkit.perf.cost, labkit.measure.scaling,
           labkit.kernels.roofline, labkit.perf.steptime, labkit.memory.estimate, labkit.memory.buffers, labkit.memory.deepspeed, labkit.comm.models,
           labkit.hardware.catalogue,
           # issue #28: the newer public API (perf planner and predictor, claims, faults, integrations)
           labkit.perf, labkit.measure.claims, labkit.teaching.faults, labkit.integrations,
           labkit.comm.buckets,   # chapter 19: DDP's bucket rule and the α–β bucket schedule
           labkit.model.expert_load,      # chapter 26: MoE load imbalance and Switch's balance loss
           labkit.perf.gemm]      # chapter 24: the GEMM-shape term (issue #24)
LABKIT_DIR = os.path.dirname(labkit.__file__)
NAN, INF = float("nan"), float("inf")

# ------------------------------------------------------------------------------------------------
# Bad values by parameter kind: (label, value). Every one must be refused.
# ------------------------------------------------------------------------------------------------
_TYPE = [("str '1e3'", "1e3"), ("None", None), ("list", [1.0])]
_FLOATS = [("nan", NAN), ("+inf", INF), ("-inf", -INF)]
BAD = {
    "pos": _TYPE + [("bool", True)] + _FLOATS + [("negative", -1.0), ("zero", 0.0)],
    "nonneg": _TYPE + [("bool", True)] + _FLOATS + [("negative", -1.0)],
    "frac": _TYPE + [("bool", True)] + _FLOATS + [("negative", -0.1), ("above 1", 1.5)],
    "frac_open0": _TYPE + [("bool", True)] + _FLOATS + [("negative", -0.1), ("zero", 0.0), ("above 1", 1.5)],
    "frac_open1": _TYPE + [("bool", True)] + _FLOATS + [("negative", -0.1), ("one", 1.0), ("above 1", 1.5)],
    "pue": _TYPE + [("bool", True)] + _FLOATS + [("negative", -1.0), ("below 1", 0.5)],
    "count": _TYPE + [("bool", True), ("nan", NAN), ("+inf", INF), ("negative", -1), ("zero", 0),
                      ("float", 2.5), ("integral float", 2.0), ("numpy float", np.float64(2.0)),
                      ("numpy bool", np.bool_(True))],
    "count0": _TYPE + [("bool", True), ("nan", NAN), ("negative", -1), ("float", 2.5)],
    "flag": [("str 'False'", "False"), ("str 'no'", "no"), ("int 0", 0), ("int 1", 1), ("None", None),
             ("float", 1.0), ("numpy int", np.int64(1)), ("list", [True])],
    "choice": [("unknown str", "nonsense"), ("None", None), ("int", 1), ("bool", True),
               ("unhashable list", ["x"]), ("float nan", NAN)],
    "str": [("None", None), ("float", 1.5), ("list", ["x"]), ("bool", True)],
    "obj": _TYPE + [("float", 1.5), ("bool", True)],
    "numels": _TYPE[:2] + [("bool", True), ("float", 1.5), ("nan", NAN), ("negative", -1),
                           ("list with negative", [1, -1]), ("list with float", [1, 2.5]),
                           ("shape with str", [(2, "x")]), ("list with None", [None])],
    "array_nonneg": _TYPE[:2] + [("with nan", [1e3, NAN, 1e5]), ("with inf", [1e3, INF, 1e5]),
                                 ("with negative", [1e3, -1.0, 1e5]), ("with bool", [True, 1e4, 1e5]),
                                 ("with str", ["1e3", 1e4, 1e5]), ("ragged", [[1.0], [1.0, 2.0], 3.0])],
    "array_finite": _TYPE[:2] + [("with nan", [0.1, NAN]), ("with inf", [-INF, 0.1]), ("with bool", [True]),
                                 ("with str", ["0.1"])],
    "array_pos": _TYPE[:2] + [("with nan", [1e-3, NAN, 1e-2]), ("with zero", [1e-3, 0.0, 1e-2]),
                              ("with negative", [1e-3, -1e-3, 1e-2]), ("with bool", [True, 1e-3, 1e-2])],
    "overlap": [("str 'False'", "False"), ("None", None), ("list", [1.0]), ("nan", NAN), ("+inf", INF),
                ("negative", -0.5), ("above 1", 1.5)],
    "throughput": _TYPE + [("nan value", {1: NAN, 2: 1.0}), ("negative value", {1: 1.0, 2: -1.0}),
                           ("float key", {1: 1.0, 2.5: 2.0}), ("bool key only", {True: 1.0}),
                           ("no baseline", {2: 1.0}), ("str value", {1: "1e3"})],
    "strs": [("bare str", "x"), ("None", None), ("float", 1.5), ("list with int", ["a", 1])],
    "peaks": _TYPE + [("empty", {}), ("nan", {"bf16": NAN}), ("negative", {"bf16": -1.0}),
                      ("bool", {"bf16": True}), ("unknown dtype", {"bf17": 1e12})],
}
BAD["whole"] = _TYPE + [("bool", True), ("nan", NAN), ("+inf", INF), ("negative", -1), ("zero", 0),
                        ("float", 2.5), ("big float", 4e6 + 0.5), ("numpy bool", np.bool_(True))]  # 4e6 is a count
BAD["optcount"] = [b for b in BAD["count"] if b[0] != "None"]      # None means "the default"
BAD["optwhole"] = [b for b in BAD["whole"] if b[0] != "None"]
BAD["optflag"] = [b for b in BAD["flag"] if b[0] != "None"]
BAD["optpos"] = [b for b in BAD["pos"] if b[0] != "None"]
BAD["optnonneg"] = [b for b in BAD["nonneg"] if b[0] != "None"]
BAD["optobj"] = [b for b in BAD["obj"] if b[0] != "None"]
BAD["optchoice"] = [b for b in BAD["choice"] if b[0] != "None"]
BAD["optstrs"] = [b for b in BAD["strs"] if b[0] != "None"]


def _numpy_twins(kind: str, value) -> list:
    """NumPy scalars equal to ``value`` that must be accepted with the same result."""
    if isinstance(value, bool) or value is None:
        return [np.bool_(value)] if kind in ("flag", "optflag") and value is not None else []
    if isinstance(value, int) and kind in ("count", "count0", "optcount", "numels", "optwhole", "whole"):
        return [np.int64(value)] + ([np.int32(value)] if abs(value) < 2**31 else [])
    if isinstance(value, (int, float)) and kind in ("pos", "nonneg", "frac", "frac_open0", "frac_open1", "pue",
                                                    "optpos", "optnonneg", "overlap"):
        twins = [np.float64(value)]
        return twins + ([np.int64(value)] if float(value).is_integer() else [])
    return []


def _extremes(kind: str) -> list:
    """Finite values far outside any real run: a finite result or a labkit ValueError, never inf."""
    if kind in ("pos", "optpos", "nonneg", "optnonneg"):
        return [1e300, 1e-300, 5e-324]
    if kind in ("count", "optcount", "count0", "numels", "whole", "optwhole"):
        return [2**40, 2**62]
    return []


# ------------------------------------------------------------------------------------------------
# The table: every public callable, valid baseline arguments and the kind of each parameter.
# ------------------------------------------------------------------------------------------------
@dataclass
class Spec:
    name: str
    fn: object
    args: dict
    kinds: dict = field(default_factory=dict)


SHAPE = labkit.flops.preset("gpt2-124m")
SPEC_H100 = labkit.hardware.catalogue.lookup("H100-SXM")
FIT = AlphaBeta(alpha_s=2e-5, beta_s_per_byte=2e-10, op="all_reduce", nranks=4)
CFG = types.SimpleNamespace(parallel="fsdp", mp_policy=None, bucket_cap_mb=25.0, reshard_after_forward=True,
                            sharding_strategy="FULL_SHARD", accum=2)
SIZES = [1e3, 1e4, 1e5, 1e6]
TIMES = [float(FIT.predict(s)) for s in SIZES]
SHAPE_KINDS = {"shape": "obj"}


def _specs() -> list[Spec]:
    f, mc, m, c, sc, r = labkit.flops, labkit.model.config, labkit.flops.mfu, labkit.perf.cost, labkit.measure.scaling, labkit.kernels.roofline
    st, me, cm, hw = labkit.perf.steptime, labkit.memory.estimate, labkit.comm.models, labkit.hardware.catalogue
    mb = labkit.memory.buffers
    ms_kinds = {k: "count" for k in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len", "n_experts",
                                     "top_k")}
    ms_kinds |= {k: "optcount" for k in ("d_ff", "n_kv_heads", "head_dim")}
    ms_kinds |= {"ffn": "choice", "norm": "choice", "pos_emb": "choice", "tied_embeddings": "flag",
                 "bias": "flag", "name": "str"}
    util = dict(tokens_per_s=1e5, n_devices=8, peak_flops=1e14)
    util_k = dict(tokens_per_s="pos", n_devices="count", peak_flops="pos")
    return [
        # ---- flops
        Spec("flops.ModelShape", ModelShape,
             dict(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=32, d_ff=None, n_kv_heads=None,
                  ffn="gelu", n_experts=1, top_k=1, tied_embeddings=True, head_dim=None, bias=False,
                  norm="layernorm", pos_emb="learned", name="x"), ms_kinds),
        Spec("flops.presets", f.presets, {}),
        Spec("flops.preset", f.preset, dict(name="gpt2-124m", seq_len=512), dict(name="choice", seq_len="count")),
        Spec("flops.n_params", f.n_params, dict(shape=SHAPE, embeddings=True, position_embeddings=None,
                                                convention="megatron-eq2"),
             dict(SHAPE_KINDS, embeddings="flag", position_embeddings="optflag", convention="choice")),
        Spec("flops.n_active_params", f.n_active_params, dict(shape=SHAPE, embeddings=False,
                                                              position_embeddings=True),
             dict(SHAPE_KINDS, embeddings="flag", position_embeddings="optflag")),
        Spec("flops.n_matmul_params", f.n_matmul_params, dict(shape=SHAPE), SHAPE_KINDS),
        Spec("flops.attention_core_flops_per_token", f.attention_core_flops_per_token,
             dict(shape=SHAPE, causal=True, seq_len=None), dict(SHAPE_KINDS, causal="flag", seq_len="optcount")),
        Spec("flops.forward_flops_per_token", f.forward_flops_per_token,
             dict(shape=SHAPE, causal=False, logits=True, seq_len=256),
             dict(SHAPE_KINDS, causal="flag", logits="flag", seq_len="optcount")),
        Spec("flops.model_flops_per_token", f.model_flops_per_token,
             dict(shape=SHAPE, method="palm", causal=False, seq_len=None),
             dict(SHAPE_KINDS, method="choice", causal="flag", seq_len="optcount")),
        Spec("flops.hardware_flops_per_token", f.hardware_flops_per_token,
             dict(shape=SHAPE, recompute="full", method="megatron", causal=True, seq_len=128),
             dict(SHAPE_KINDS, recompute="choice", method="choice", causal="flag", seq_len="optcount")),
        Spec("flops.flops_per_step", f.flops_per_step,
             dict(shape=SHAPE, tokens=4096, method="6N", causal=False, recompute="selective", hardware=True,
                  seq_len=None),
             dict(SHAPE_KINDS, tokens="count", method="choice", causal="flag", recompute="choice",
                  hardware="flag", seq_len="optcount")),
        # ---- model_config
        Spec("model.config.GPTConfig", GPTConfig,
             dict(n_layers=2, d_model=64, n_heads=4, vocab_size=100, seq_len=32, d_ff=None, attention="sdpa",
                  checkpoint=False, dropout=0.0, n_experts=0, top_k=2, aux_loss_coef=0.0),
             dict(n_layers="count", d_model="count", n_heads="count", vocab_size="count", seq_len="count",
                  d_ff="optcount", attention="choice", checkpoint="flag", dropout="frac_open1", n_experts="count0",
                  top_k="count", aux_loss_coef="nonneg")),
        # ---- moe_stats (chapter 26)
        Spec("model.expert_load.load_imbalance", labkit.model.expert_load.load_imbalance, dict(counts=[3, 1, 2, 2]),
             dict(counts="array_nonneg")),
        Spec("model.expert_load.balance_loss", labkit.model.expert_load.balance_loss,
             dict(fractions=[0.5, 0.25, 0.25], probs=[0.4, 0.3, 0.3]),
             dict(fractions="array_nonneg", probs="array_nonneg")),
        Spec("model.config.gpt_config", mc.gpt_config, dict(name="tiny", seq_len=32, checkpoint=True),
             dict(name="choice", seq_len="optcount", checkpoint="optflag")),
        # ---- mfu
        Spec("flops.mfu.achieved_flops", m.achieved_flops, dict(tokens_per_s=1e5, flops_per_token=1e9),
             dict(tokens_per_s="pos", flops_per_token="pos")),
        Spec("flops.mfu.tokens_per_s_per_device", m.tokens_per_s_per_device, dict(tokens_per_s=1e5, n_devices=8),
             dict(tokens_per_s="pos", n_devices="count")),
        Spec("flops.mfu.step_tokens_per_s", m.step_tokens_per_s, dict(tokens_per_step=4096, step_time_s=0.5),
             dict(tokens_per_step="pos", step_time_s="pos")),
        Spec("flops.mfu.mfu", m.mfu, dict(util, flops_per_token=1e9), dict(util_k, flops_per_token="pos")),
        Spec("flops.mfu.hfu", m.hfu, dict(util, hardware_flops_per_token=1.2e9),
             dict(util_k, hardware_flops_per_token="pos")),
        Spec("flops.mfu.tokens_per_s_for_mfu", m.tokens_per_s_for_mfu,
             dict(target_mfu=0.4, flops_per_token=1e9, n_devices=8, peak_flops=1e14),
             dict(target_mfu="frac_open0", flops_per_token="pos", n_devices="count", peak_flops="pos")),
        # ---- cost
        Spec("perf.cost.extra_wallclock_fraction", c.extra_wallclock_fraction, dict(throughput_drop=0.3),
             dict(throughput_drop="frac_open1")),
        Spec("perf.cost.wallclock_s", c.wallclock_s, dict(tokens=1e9, tokens_per_s=1e5),
             dict(tokens="pos", tokens_per_s="pos")),
        Spec("perf.cost.throughput_for_deadline", c.throughput_for_deadline, dict(tokens=1e12, days=30.0),
             dict(tokens="pos", days="pos")),
        Spec("perf.cost.training_cost", c.training_cost,
             dict(tokens=1e12, flops_per_token=6e9, n_devices=64, peak_flops=1e15, mfu=0.4, tokens_per_s=None,
                  price_per_device_hour=2.0, device_power_w=700.0, pue=1.1),
             dict(tokens="pos", flops_per_token="pos", n_devices="count", peak_flops="pos", mfu="frac_open0",
                  tokens_per_s="optpos", price_per_device_hour="optnonneg", device_power_w="optpos", pue="pue")),
        Spec("cost.training_cost(tokens_per_s)", c.training_cost,
             dict(tokens=1e12, flops_per_token=6e9, n_devices=64, tokens_per_s=1e6),
             dict(tokens="pos", flops_per_token="pos", n_devices="count", tokens_per_s="pos")),
        Spec("perf.cost.device_choice", c.device_choice,
             dict(tokens=1e12, flops_per_token=6e9, mfu=0.4, n_devices=64, devices=["H100-SXM", "A100-SXM-80GB"],
                  dtype="bf16", reference="H100-SXM", prices={"H100-SXM": 2.0}),
             dict(tokens="pos", flops_per_token="pos", mfu="frac_open0", n_devices="count", dtype="choice",
                  reference="choice", devices="optstrs", prices="optobj")),
        # ---- perf.steptime (scaling re-exports step_time, StepParts, decompose; cost tokens_per_s_at)
        Spec("perf.step_time", st.step_time, dict(compute_s=0.09, comm_s=0.065, sync_s=0.045, overlap=0.5),
             dict(compute_s="nonneg", comm_s="nonneg", sync_s="nonneg", overlap="overlap")),
        Spec("perf.StepParts", StepParts, dict(compute_s=0.1, comm_s=0.05, sync_s=0.01),
             dict(compute_s="nonneg", comm_s="nonneg", sync_s="nonneg")),
        Spec("perf.StepParts.step", StepParts(0.1, 0.05, 0.01).step, dict(overlap=True), dict(overlap="overlap")),
        Spec("perf.StepParts.exposed_comm", StepParts(0.1, 0.05, 0.01).exposed_comm, dict(overlap=0.25),
             dict(overlap="overlap")),
        Spec("perf.decompose", st.decompose, dict(t1_s=0.4, n=4, serial_step_s=0.25, overlapped_step_s=0.2),
             dict(t1_s="pos", n="count", serial_step_s="pos", overlapped_step_s="pos")),
        Spec("perf.compute_time", st.compute_time,
             dict(tokens=1e6, flops_per_token=1e9, peak_flops=1e14, n_devices=8, mfu=0.4),
             dict(tokens="pos", flops_per_token="pos", peak_flops="pos", n_devices="count", mfu="frac_open0")),
        Spec("perf.tokens_per_s_at", st.tokens_per_s_at,
             dict(mfu=0.4, peak_flops=1e14, n_devices=8, flops_per_token=1e9),
             dict(mfu="frac_open0", peak_flops="pos", n_devices="count", flops_per_token="pos")),
        Spec("perf.data_parallel_comm_s", st.data_parallel_comm_s,
             dict(cfg=CFG, params=10**6, n_units=3, nranks=4, alpha_beta=FIT, reduce_scatter_as_all_reduce=False),
             dict(cfg="obj", params="count0", n_units="count", nranks="count", alpha_beta="optobj",
                  reduce_scatter_as_all_reduce="flag", op_links="optobj")),
        Spec("perf.concurrency_slowdown", st.concurrency_slowdown, dict(rate_alone=4e10, rate_concurrent=3e10),
             dict(rate_alone="pos", rate_concurrent="pos")),
        Spec("perf.unit_overhead_s", st.unit_overhead_s,
             dict(wrapped_step_s=0.13, plain_step_s=0.1, n_units=3, micro_batches=2),
             dict(wrapped_step_s="pos", plain_step_s="pos", n_units="count", micro_batches="count")),
        Spec("perf.wrapper_overhead_s", st.wrapper_overhead_s, dict(per_unit_s=0.005, n_units=3, micro_batches=2,
                                                                    slowdown=1.5),
             dict(per_unit_s="nonneg", n_units="count", micro_batches="count", slowdown="pos")),
        # ---- scaling
        Spec("measure.scaling.speedup", sc.speedup, dict(t1_s=0.4, tn_s=0.08), dict(t1_s="pos", tn_s="pos")),
        Spec("measure.scaling.strong_efficiency", sc.strong_efficiency, dict(t1_s=0.4, tn_s=0.08, n=8),
             dict(t1_s="pos", tn_s="pos", n="count")),
        Spec("measure.scaling.weak_efficiency", sc.weak_efficiency, dict(t1_s=0.4, tn_s=0.5), dict(t1_s="pos", tn_s="pos")),
        Spec("measure.scaling.throughput_efficiency", sc.throughput_efficiency, dict(x1=1e4, xn=3e4, n=4),
             dict(x1="pos", xn="pos", n="count")),
        Spec("measure.scaling.amdahl_speedup", sc.amdahl_speedup, dict(serial_fraction=0.05, n=8),
             dict(serial_fraction="frac", n="count")),
        Spec("measure.scaling.gustafson_speedup", sc.gustafson_speedup, dict(serial_fraction=0.05, n=8),
             dict(serial_fraction="frac", n="count")),
        Spec("measure.scaling.scaling_table", sc.scaling_table, dict(throughput={1: 1e4, 2: 1.8e4, 4: 3e4}, mode="strong"),
             dict(throughput="throughput", mode="choice")),
        # ---- roofline
        Spec("kernels.roofline.matmul_flops", r.matmul_flops, dict(m=64, n=128, k=256),
             dict(m="count", n="count", k="count")),
        Spec("kernels.roofline.matmul_bytes", r.matmul_bytes, dict(m=64, n=128, k=256, dtype="bf16"),
             dict(m="count", n="count", k="count", dtype="choice")),
        Spec("kernels.roofline.arithmetic_intensity", r.arithmetic_intensity, dict(flops=1e9, nbytes=1e6),
             dict(flops="pos", nbytes="pos")),
        Spec("kernels.roofline.ridge_point", r.ridge_point, dict(peak_flops=1e15, bandwidth=3e12),
             dict(peak_flops="pos", bandwidth="pos")),
        Spec("kernels.roofline.attainable", r.attainable, dict(intensity=100.0, peak_flops=1e15, bandwidth=3e12),
             dict(intensity="pos", peak_flops="pos", bandwidth="pos")),
        Spec("kernels.roofline.bound", r.bound, dict(intensity=100.0, peak_flops=1e15, bandwidth=3e12),
             dict(intensity="pos", peak_flops="pos", bandwidth="pos")),
        Spec("kernels.roofline.default_shapes", r.default_shapes, dict(fast=True, device_type="cpu"),
             dict(fast="flag", device_type="str")),
        # ---- memory.estimate
        Spec("memory.fmt_bytes", me.fmt_bytes, dict(n=3 * 2**30, unit="GiB"), dict(n="nonneg", unit="choice")),
        Spec("memory.canonical_strategy", me.canonical_strategy, dict(strategy="FULL_SHARD"),
             dict(strategy="choice")),
        Spec("memory.model_state_bytes", me.model_state_bytes,
             dict(n_params=7_500_000_000, strategy="fsdp_hybrid", n_ranks=16, precision="bf16_mixed",
                  optimizer="adam", shard_size=8, rank=3),
             dict(n_params="numels", strategy="choice", n_ranks="count", precision="choice", optimizer="choice",
                  shard_size="optcount", rank="count0")),
        Spec("memory.model_state_bytes(shapes)", me.model_state_bytes,
             dict(n_params=[(768, 768), (768,), 50257], strategy="zero3", n_ranks=4),
             dict(n_params="numels", n_ranks="count")),
        Spec("memory.activation_bytes", me.activation_bytes,
             dict(shape=SHAPE, micro_batch=4, recompute="none", tp=2, sequence_parallel=True, seq_len=None,
                  dtype_bytes=2, flash_attention=False, include_head=True, attention=None, dropout=None, mask_bytes=1),
             dict(SHAPE_KINDS, micro_batch="count", recompute="choice", tp="count", sequence_parallel="flag",
                  seq_len="optcount", dtype_bytes="count", flash_attention="flag", include_head="flag",
                  attention="optchoice", dropout="optflag", mask_bytes="count")),
        Spec("memory.activation_bytes(attention)", me.activation_bytes,
             dict(shape=SHAPE, micro_batch=2, tp=2, dtype_bytes=4, include_head=True, attention="naive", dropout=True,
                  mask_bytes=4),
             dict(micro_batch="count", tp="count", dtype_bytes="count", include_head="flag", attention="optchoice",
                  dropout="optflag", mask_bytes="count")),
        Spec("memory.pipeline_in_flight", me.pipeline_in_flight,
             dict(pp=4, micro_batches=8, schedule="interleaved", virtual_stages=2),
             dict(pp="count", micro_batches="count", schedule="choice", virtual_stages="count")),
        Spec("memory.stage_activation_bytes", me.stage_activation_bytes,
             dict(shape=SHAPE, micro_batch=2, pp=4, micro_batches=8, schedule="1f1b", virtual_stages=1, cp=2,
                  seq_len=None),
             dict(SHAPE_KINDS, micro_batch="count", pp="count", micro_batches="count", schedule="choice",
                  virtual_stages="count", cp="count", seq_len="optcount")),
        Spec("memory.attention_saved_bytes", me.attention_saved_bytes,
             dict(attention="naive", batch=2, heads=4, seq_len=64, head_dim=8, dtype_bytes=2, dropout=True,
                  causal=True, output=True, mask_bytes=1),
             dict(attention="choice", batch="count", heads="count", seq_len="count", head_dim="count",
                  dtype_bytes="count", dropout="flag", causal="flag", output="flag", mask_bytes="count")),
        Spec("memory.activation_bytes(GPTConfig)", me.activation_bytes,
             dict(shape=labkit.model.config.gpt_config("tiny"), micro_batch=2, seq_len=48),
             dict(micro_batch="count", seq_len="optcount")),
        Spec("memory.ddp_bucket_sizes", mb.ddp_bucket_sizes,
             dict(params=[(1024, 1024), (1024,), 4096], bucket_cap_mb=1.0, dtype_bytes=4),
             dict(params="numels", bucket_cap_mb="pos", dtype_bytes="count")),
        Spec("memory.comm_buffer_bytes", mb.comm_buffer_bytes,
             dict(n_params=10**8, strategy="fsdp_full", n_ranks=4, precision="bf16_mixed", bucket_cap_mb=25.0,
                  unit_params=10**7, prefetch=True, gradient_as_bucket_view=False),
             dict(n_params="numels", strategy="choice", n_ranks="count", precision="choice", bucket_cap_mb="pos",
                  unit_params="count", prefetch="flag", gradient_as_bucket_view="flag")),
        Spec("memory.comm_buffer_bytes(ddp)", mb.comm_buffer_bytes,
             dict(n_params=10**8, strategy="ddp", bucket_cap_mb=25.0, unit_params=None),
             dict(n_params="numels", bucket_cap_mb="pos", unit_params="optcount")),
        # ---- memory.deepspeed
        Spec("memory.deepspeed_zero2_estimate", labkit.memory.deepspeed.deepspeed_zero2_estimate,
             dict(total_params=2851e6, num_gpus_per_node=8, num_nodes=2, additional_buffer_factor=1.5, legacy=False),
             dict(total_params="pos", num_gpus_per_node="count", num_nodes="count", additional_buffer_factor="pos",
                  legacy="flag")),
        Spec("memory.deepspeed_zero3_estimate", labkit.memory.deepspeed.deepspeed_zero3_estimate,
             dict(total_params=2851e6, largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=2,
                  additional_buffer_factor=1.5),
             dict(total_params="pos", largest_layer_params="nonneg", num_gpus_per_node="count", num_nodes="count",
                  additional_buffer_factor="pos")),
        Spec("memory.deepspeed.compare_with_labkit", labkit.memory.deepspeed.compare_with_labkit,
             dict(total_params=2851e6, num_gpus_per_node=8, num_nodes=1, stage=3, largest_layer_params=32e6),
             dict(total_params="pos", num_gpus_per_node="count", num_nodes="count", stage="choice",
                  largest_layer_params="nonneg")),
        # ---- comm.models
        Spec("comm.canonical_op", cm.canonical_op, dict(op="allreduce"), dict(op="choice")),
        Spec("comm.bus_factor", cm.bus_factor, dict(op="all_gather", nranks=8), dict(op="choice", nranks="count")),
        Spec("comm.link_factor", cm.link_factor, dict(op="all_reduce", nranks=8, algorithm="nvls"),
             dict(op="choice", nranks="count", algorithm="choice")),
        Spec("comm.bytes_of", cm.bytes_of, dict(count=1024, dtype="bfloat16"), dict(count="count0", dtype="choice")),
        Spec("comm.algbw", cm.algbw, dict(op="all_reduce", size_bytes=2**20, time_s=1e-3),
             dict(op="choice", size_bytes="nonneg", time_s="pos")),
        Spec("comm.busbw", cm.busbw, dict(op="all_reduce", size_bytes=2**20, time_s=1e-3, nranks=4),
             dict(op="choice", size_bytes="nonneg", time_s="pos", nranks="count")),
        Spec("comm.ring_steps", cm.ring_steps, dict(op="reduce_scatter", nranks=8), dict(op="choice", nranks="count")),
        Spec("comm.ring_time", cm.ring_time, dict(op="all_reduce", size_bytes=2**24, nranks=8, alpha=5e-6, beta=1e-10),
             dict(op="choice", size_bytes="nonneg", nranks="count", alpha="nonneg", beta="nonneg")),
        Spec("comm.tree_time", cm.tree_time,
             dict(op="all_reduce", size_bytes=2**24, nranks=8, alpha=5e-6, beta=1e-10, pipelined=False),
             dict(op="choice", size_bytes="nonneg", nranks="count", alpha="nonneg", beta="nonneg",
                  pipelined="flag")),
        Spec("comm.hierarchical_time", cm.hierarchical_time,
             dict(op="all_reduce", size_bytes=2**24, nranks=16, alpha=2e-6, beta=1e-11, ranks_per_node=8,
                  alpha_inter=2e-5, beta_inter=4e-11),
             dict(op="choice", size_bytes="nonneg", nranks="count", alpha="nonneg", beta="nonneg",
                  ranks_per_node="count", alpha_inter="nonneg", beta_inter="nonneg")),
        Spec("comm.hierarchical_time(broadcast)", cm.hierarchical_time,
             dict(op="broadcast", size_bytes=2**24, nranks=16, alpha=2e-6, beta=1e-11, ranks_per_node=8,
                  alpha_inter=2e-5, beta_inter=4e-11),
             dict(alpha="nonneg", beta="nonneg", alpha_inter="nonneg", beta_inter="nonneg")),
        Spec("comm.AlphaBeta", AlphaBeta, dict(alpha_s=2e-5, beta_s_per_byte=2e-10, op="all_reduce", nranks=4,
                                               sizes=(1e3, 1e6), rel_errors=(0.01, -0.02)),
             dict(alpha_s="nonneg", beta_s_per_byte="nonneg", op="choice", nranks="count", sizes="array_nonneg",
                  rel_errors="array_finite")),
        Spec("comm.AlphaBeta.predict", FIT.predict, dict(size_bytes=SIZES), dict(size_bytes="array_nonneg")),
        Spec("comm.fit_alpha_beta", cm.fit_alpha_beta,
             dict(sizes_bytes=SIZES, times_s=TIMES, op="all_reduce", nranks=4, huber=0.15, iters=20),
             dict(sizes_bytes="array_nonneg", times_s="array_pos", op="choice", nranks="count", huber="pos",
                  iters="count")),
        # ---- hardware.catalogue
        Spec("hardware.normalize_dtype", hw.normalize_dtype, dict(dtype="bfloat16"), dict(dtype="choice")),
        Spec("hardware.known_devices", hw.known_devices, {}),
        Spec("hardware.lookup", hw.lookup, dict(name="NVIDIA H100 80GB HBM3"), dict(name="choice")),
        Spec("hardware.family", hw.family, dict(name="A100"), dict(name="choice")),
        Spec("hardware.lookup_peak", hw.lookup_peak, dict(name="V100 SXM2", dtype="fp16"),
             dict(name="choice", dtype="choice")),
        Spec("hardware.DeviceSpec", DeviceSpec,
             dict(name="X1", vendor="acme", peak_flops={"bf16": 1e15}, memory_bytes=2**34, memory_bw=2e12,
                  source="datasheet", aliases=("acme x1",), note=""),
             dict(name="str", vendor="str", peak_flops="peaks", memory_bytes="count0", memory_bw="pos",
                  source="str", note="str", aliases="strs")),
        Spec("hardware.DeviceSpec.peak", SPEC_H100.peak, dict(dtype="bf16"), dict(dtype="choice")),
        Spec("hardware.DeviceSpec.ridge_point", SPEC_H100.ridge_point, dict(dtype="fp8"), dict(dtype="choice")),
        # ---- issue #17 (appended: rows above keep their seeded mixes)
        Spec("flops.mfu.mfu_from_flops", m.mfu_from_flops, dict(achieved_flops_per_device=4e14, peak_flops=989e12),
             dict(achieved_flops_per_device="pos", peak_flops="pos")),
        Spec("flops.mfu.hfu_from_flops", m.hfu_from_flops,
             dict(achieved_hardware_flops_per_device=4.5e14, peak_flops=989e12),
             dict(achieved_hardware_flops_per_device="pos", peak_flops="pos")),
        # ---- shapes (transformers configs, FLOPs from a bare N)
        Spec("model.shapes.from_hf_config", labkit.model.shapes.from_hf_config,
             dict(cfg=dict(model_type="llama", hidden_size=64, intermediate_size=224, num_hidden_layers=2,
                           num_attention_heads=8, num_key_value_heads=2, vocab_size=512,
                           max_position_embeddings=32), seq_len=None),
             dict(cfg="obj", seq_len="optcount")),
        Spec("model.shapes.flops_per_token_from_params", labkit.model.shapes.flops_per_token_from_params,
             dict(n_params=7.5e9, convention="6N"), dict(n_params="pos", convention="choice")),
        # ---- batch
        Spec("train.batch.sequences_per_step", labkit.train.batch.sequences_per_step, dict(micro_batch=12, n_ranks=8, accum_steps=5),
             dict(micro_batch="count", n_ranks="count", accum_steps="count")),
        Spec("train.batch.tokens_per_step", labkit.train.batch.tokens_per_step,
             dict(micro_batch=12, seq_len=1024, n_ranks=8, accum_steps=5),
             dict(micro_batch="count", seq_len="count", n_ranks="count", accum_steps="count")),
        Spec("train.batch.accum_steps", labkit.train.batch.accum_steps,
             dict(micro_batch=12, n_ranks=8, seq_len=1024, global_tokens=491_520, global_sequences=None),
             dict(micro_batch="count", n_ranks="count", seq_len="optcount", global_tokens="optwhole",
                  global_sequences="optwhole")),
        Spec("batch.accum_steps(sequences)", labkit.train.batch.accum_steps,
             dict(micro_batch=2, n_ranks=64, global_sequences=1024),
             dict(micro_batch="count", n_ranks="count", global_sequences="whole")),
        # ---- issue #28: perf (planner, predictor), claims, faults, integrations
        Spec("perf.cluster(nodes)", labkit.perf.cluster, dict(name="dgx-a100", nodes=2), dict(nodes="optcount")),
        Spec("perf.resolve_model", labkit.perf.resolve_model, dict(model="llama3-8b", seq_len=1024),
             dict(model="choice", seq_len="optcount")),
        Spec("perf.plan", labkit.perf.plan,
             dict(model="llama3-8b", cluster=labkit.perf.cluster("dgx-a100"), global_batch=64, seq_len=1024,
                  achievable=0.5, method="palm", dtype="bf16", strategies=("zero1",), recompute=("none",),
                  micro_batches=(1,), schedule="1f1b", virtual_stages=(), allow_cross_node_tp=False,
                  sequence_parallel=True, flash_attention=True, memory_fraction=0.9, n_gpus=None,
                  context_parallel=(1,), expert_parallel=(1,), pipeline_parallel=(1, 2)),
             dict(model="choice", cluster="obj", global_batch="count", seq_len="optcount", achievable="frac_open0",
                  method="choice", dtype="choice", strategies="obj", recompute="obj", micro_batches="obj",
                  schedule="choice", virtual_stages="obj", allow_cross_node_tp="flag", sequence_parallel="flag",
                  flash_attention="flag", memory_fraction="frac_open0", n_gpus="optcount", context_parallel="obj",
                  expert_parallel="obj", pipeline_parallel="optobj")),
        Spec("perf.calibrate_achievable", labkit.perf.calibrate_achievable,
             dict(model="llama3-8b", layout=labkit.perf.Layout(dp=8), cluster=labkit.perf.cluster("dgx-h100"),
                  global_batch=64, tokens_per_s_per_gpu=5000.0, source="a run"),
             dict(model="choice", layout="obj", cluster="obj", global_batch="count", tokens_per_s_per_gpu="pos",
                  source="str", seq_len="optcount")),
        Spec("measure.claims.judge", labkit.measure.claims.judge, dict(left=2.0, op=">", right=1.0, margin=0.05, noise=0.01),
             dict(left="nonneg", op="choice", right="nonneg", margin="nonneg", noise="nonneg")),
        Spec("measure.claims.stored_claims", labkit.measure.claims.stored_claims, dict(nb={"cells": []}), dict(nb="obj")),
        # ---- comm.buckets (chapter 19)
        Spec("comm.buckets.ddp_caps", labkit.comm.buckets.ddp_caps, dict(bucket_cap_mb=25.0),
             dict(bucket_cap_mb="optpos")),
        Spec("comm.buckets.assign_buckets", labkit.comm.buckets.assign_buckets,
             dict(nbytes=[4, 2, 4], limits=[4, 8], keys=None), dict(nbytes="obj", limits="obj", keys="optobj")),
        Spec("comm.buckets.ddp_buckets", labkit.comm.buckets.ddp_buckets,
             dict(params=[(1024, 256), (256,), 4096], bucket_cap_mb=0.25, order=None, dtype_bytes=4),
             dict(params="obj", bucket_cap_mb="optpos", order="optobj", dtype_bytes="count")),
        Spec("comm.buckets.bucket_schedule", labkit.comm.buckets.bucket_schedule,
             dict(bucket_bytes=[1e6, 2e6], backward_s=0.1, nranks=8, alpha_s=5e-6, beta_s_per_byte=1e-11),
             dict(bucket_bytes="array_nonneg", backward_s="nonneg", nranks="count", alpha_s="nonneg",
                  beta_s_per_byte="nonneg")),
        Spec("comm.buckets.cap_sweep", labkit.comm.buckets.cap_sweep,
             dict(params=10**8, caps_mb=[None, 25.0], backward_s=0.1, nranks=8, alpha_s=5e-6, beta_s_per_byte=1e-11,
                  dtype_bytes=4),
             dict(params="numels", caps_mb="array_pos", backward_s="nonneg", nranks="count", alpha_s="nonneg",
                  beta_s_per_byte="nonneg", dtype_bytes="count")),
        # ---- perf.gemm (chapter 24, issue #24): the GEMM-shape term
        Spec("perf.gemm.layer_gemms", labkit.perf.gemm.layer_gemms,
             dict(shape=SHAPE, micro_batch=2, seq_len=None, tp=2, flash_attention=False, logits=True),
             dict(shape="obj", micro_batch="count", seq_len="optcount", tp="count", flash_attention="flag",
                  logits="flag")),
        Spec("perf.gemm.gemm_seconds", labkit.perf.gemm.gemm_seconds,
             dict(g=labkit.perf.gemm.Gemm("x", 64, 64, 16), math_flops=1e14, memory_bw=2e12, operand_bytes=2),
             dict(g="obj", math_flops="pos", memory_bw="pos", operand_bytes="pos")),
        Spec("perf.gemm.activation_traffic_bytes", labkit.perf.gemm.activation_traffic_bytes,
             dict(shape=SHAPE, micro_batch=2, tp=2, recompute="full", sequence_parallel=False, flash_attention=False,
                  seq_len=None, dtype_bytes=2),
             dict(shape="obj", micro_batch="count", tp="count", recompute="choice", sequence_parallel="flag",
                  flash_attention="flag", seq_len="optcount", dtype_bytes="count")),
        Spec("perf.gemm.shape_efficiency", labkit.perf.gemm.shape_efficiency,
             dict(shape=SHAPE, micro_batch=1, tp=2, cluster=labkit.perf.cluster("dgx-a100"), dtype="bf16",
                  achievable=0.5, flash_attention=False, seq_len=None, recompute="full", sequence_parallel=False),
             dict(shape="obj", micro_batch="count", tp="count", cluster="obj", dtype="choice", achievable="frac_open0",
                  flash_attention="flag", seq_len="optcount", recompute="choice", sequence_parallel="flag")),
        Spec("integrations.flops_per_token_of", labkit.integrations.flops_per_token_of,
             dict(model=SHAPE, seq_len=None, method="palm"), dict(model="obj", seq_len="optcount", method="choice")),
        # ---- issue #37: the APIs added since round two (ring attention, fusion, scheduling, perf_validate)
        Spec("train.ring_attention.chunk_ids", labkit.train.ring_attention.chunk_ids, dict(rank=1, cp=2, balanced=True),
             dict(rank="count0", cp="count", balanced="flag")),
        Spec("train.ring_attention.chunk_pairs", labkit.train.ring_attention.chunk_pairs, dict(cp=2, balanced=False),
             dict(cp="count", balanced="flag")),
        Spec("kernels.fusion.graph_step_us", labkit.kernels.fusion.graph_step_us,
             dict(n_kernels=10, kernel_us=5.0, launch_us=3.0, graphed=False, graph_launch_us=10.0, gap_us=1.0),
             dict(n_kernels="count", kernel_us="pos", launch_us="nonneg", graphed="flag", graph_launch_us="nonneg",
                  gap_us="nonneg")),
        Spec("perf.scheduling.jobs", labkit.perf.scheduling.jobs,
             dict(seed=0, hours=24.0, arrivals_per_h=2.0, max_gpus=8, mean_job_h=3.0),
             dict(seed="count0", hours="pos", arrivals_per_h="pos", max_gpus="count", mean_job_h="pos")),
        Spec("perf.scheduling.simulate", labkit.perf.scheduling.simulate,
             dict(nodes=2, gpus_per_node=4, hours=12.0, arrivals_per_h=2.0, max_gpus=8, mean_job_h=2.0,
                  policy="backfill", failures_per_job_h=0.02, checkpoint_every_min=60, restart_min=10, seed=0),
             dict(nodes="count", gpus_per_node="count", hours="pos", arrivals_per_h="pos", max_gpus="count",
                  mean_job_h="pos", policy="choice", failures_per_job_h="nonneg", checkpoint_every_min="count",
                  restart_min="count0", seed="count0")),
        Spec("perf.validate.PartTimes", labkit.perf.validate.stage_times.PartTimes,
             dict(embed_s=1e-3, block_s=2e-3, tail_s=3e-3, n_layers=4, block_tp_s=()),
             dict(embed_s="nonneg", block_s="pos", tail_s="nonneg", n_layers="count", block_tp_s="obj")),
        Spec("perf.validate.fit_tp_cycle", labkit.perf.validate.tp_cycle.fit_tp_cycle,
             dict(act_bytes=[1e5, 2e5, 4e5], cost_s=[1e-4, 2e-4, 4e-4], nranks=4, tp=2, includes_all_reduces=False),
             dict(act_bytes="array_pos", cost_s="array_finite", nranks="count", tp="optcount",
                  includes_all_reduces="flag")),
        Spec("perf.validate.fit_unit_cycle", labkit.perf.validate.fit.fit_unit_cycle,
             dict(unit_bytes=[1e6, 2e6], cost_s=[1e-3, 2e-3], nranks=2, one_rank_s=(), n_rank_s=()),
             dict(unit_bytes="array_pos", cost_s="array_finite", nranks="count", one_rank_s="array_nonneg", n_rank_s="array_nonneg")),
    ]


SPECS = _specs()

# Public callables that measure (time the device, launch ranks, count a live model) or only hold results:
# not fuzzed here with valid values (that would run them); their early refusals are tested below.
MEASURES = {"flops.count_flops", "model.shapes.compare", "measure.scaling.measure_scaling", "kernels.roofline.time_matmul",
            "kernels.roofline.sweep_matmul", "memory.deepspeed.deepspeed_params",
            "teaching.faults.mystery_run",            # launches ranks
            "measure.claims.claim",                  # prints and publishes a verdict (its judge is fuzzed above)
            "integrations.meter_for"}        # builds a live Meter on a model (flops_per_token_of is fuzzed)
RESULTS = {"flops.FlopCount", "perf.cost.TrainingCost", "kernels.roofline.MatmulTiming", "memory.estimate.MemoryBreakdown",
           "memory.deepspeed.DeepSpeedRow", "memory.deepspeed.DeepSpeedEstimate", "hardware.catalogue.DeviceFamily",
           "perf.Prediction", "perf.Plan", "perf.Calibration", "perf.gemm.Gemm", "measure.claims.Claim", "measure.claims.ClaimContradicted", "teaching.faults.Fault",
           "teaching.faults.MysteryRun", "measure.claims.rejudge", "comm.buckets.BucketPlan",     # rejudge reads a stored Claim back (a result)
           # configs checked in their own __post_init__ and by tests/test_perf_*.py; not yet rows here
           "perf.Layout", "perf.Cluster", "perf.predict", "teaching.faults.public_record",
           # lab 8's job: its seed and options checked by tests/test_faults.py (a seed is a number or a ticket)
           "teaching.faults.LoaderJob"}


def _public_callables() -> dict[str, object]:
    """{"module.name": object} for every callable in the estimator modules' ``__all__`` (re-exports once)."""
    seen: dict[int, tuple[str, object]] = {}
    for mod in MODULES:
        short = mod.__name__.removeprefix("labkit.")
        for name in mod.__all__:
            obj = getattr(mod, name)
            if callable(obj) and id(obj) not in seen:
                seen[id(obj)] = (f"{short}.{name}", obj)
    return dict(seen.values())


def test_every_public_callable_is_fuzzed_or_listed():
    """A new public function fails here until it gets a row in the table (or a reason not to)."""
    covered = {id(s.fn) for s in SPECS}
    missing = [q for q, obj in _public_callables().items() if id(obj) not in covered and q not in MEASURES | RESULTS]
    assert not missing, f"public callables with no fuzz row: {missing}"
    assert MEASURES | RESULTS <= set(_public_callables())


def test_every_parameter_has_a_kind():
    """The main row of each callable gives a kind to every named parameter (its other rows vary a few)."""
    for s in SPECS:
        if "(" in s.name:
            continue
        named = {p for p, v in inspect.signature(s.fn).parameters.items()
                 if v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)}
        assert named <= set(s.kinds), f"{s.name}: no kind for {named - set(s.kinds)}"


# ------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------
def _assert_clean(x, where, path="result"):
    """Every number inside a result (dataclass, dict, list, array, DataFrame) is finite and >= 0."""
    if isinstance(x, (bool, str, np.bool_)) or x is None:
        return
    if isinstance(x, int):                                  # exact Python ints never overflow
        assert x >= 0, f"{where}: {path} = {x} is negative"
        return
    if isinstance(x, pd.DataFrame):
        x = {c: x[c].to_numpy() for c in x.columns if pd.api.types.is_numeric_dtype(x[c])}
    if isinstance(x, (list, tuple)) and x and all(type(v) in (int, float) for v in x):
        x = np.asarray(x, dtype=float)                      # long lists of numbers, checked at once
    if isinstance(x, (float, np.integer, np.floating, np.ndarray)):
        a = np.asarray(x, dtype=float)
        bad = ~np.isfinite(a) | (a < 0)
        assert not bad.any(), f"{where}: {path} = {a[bad].ravel()[:3]} (NaN, inf or negative)"
    elif dataclasses.is_dataclass(x):
        for fld in dataclasses.fields(x):
            if fld.name != "rel_errors":                    # fit residuals are signed by definition
                _assert_clean(getattr(x, fld.name), where, f"{path}.{fld.name}")
    elif isinstance(x, dict):
        for k, v in x.items():
            _assert_clean(v, where, f"{path}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _assert_clean(v, where, f"{path}[{i}]")


def _same(a, b) -> bool:
    if isinstance(a, pd.DataFrame):
        return isinstance(b, pd.DataFrame) and a.equals(b)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, np.ndarray)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (float, np.floating)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b and type(a) is type(b)


def _raise_site(e: BaseException) -> str:
    """The file of the innermost frame: where the exception was raised."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename


def _assert_refused(spec: Spec, param: str, label: str, value, e: BaseException | None):
    where = f"{spec.name}({param}={label}: {value!r})"
    assert e is not None, f"{where} was accepted"
    assert isinstance(e, ValueError), f"{where} raised a raw {type(e).__name__}: {e}"
    assert _raise_site(e).startswith(LABKIT_DIR), \
        f"{where}: {type(e).__name__} raised in {_raise_site(e)}, not by labkit: {e}"
    msg = str(e)
    assert param in msg, f"{where}: the message does not name {param!r}: {msg}"
    assert "\n" not in msg.strip(), f"{where}: message is not one line: {msg!r}"


def _call(spec: Spec, **changes):
    try:
        return spec.fn(**{**spec.args, **changes}), None
    except Exception as e:     # noqa: BLE001 - classified by the caller
        return None, e


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_baseline_is_valid_and_clean(spec):
    result, e = _call(spec)
    assert e is None, f"{spec.name}: the baseline arguments raise {type(e).__name__}: {e}"
    _assert_clean(result, spec.name)


CASES = [(s, p, kind) for s in SPECS for p, kind in s.kinds.items()]
WITH_KINDS = [s for s in SPECS if s.kinds]


@pytest.mark.parametrize("spec", WITH_KINDS, ids=lambda s: s.name)
def test_bad_values_are_refused_with_the_parameter_named(spec):
    for param, kind in spec.kinds.items():
        for label, value in BAD[kind]:
            result, e = _call(spec, **{param: value})
            _assert_refused(spec, param, label, value, e)


@pytest.mark.parametrize("spec", WITH_KINDS, ids=lambda s: s.name)
def test_numpy_scalars_are_accepted_and_extremes_never_overflow(spec):
    base, _ = _call(spec)
    for param, kind in spec.kinds.items():
        for twin in _numpy_twins(kind, spec.args.get(param)):
            result, e = _call(spec, **{param: twin})
            assert e is None, f"{spec.name}({param}={twin!r}): a NumPy scalar is refused: {type(e).__name__}: {e}"
            assert _same(base, result), f"{spec.name}({param}={twin!r}) gives {result!r}, not {base!r}"
        for value in _extremes(kind):
            result, e = _call(spec, **{param: value})
            where = f"{spec.name}({param}={value!r})"
            if e is None:
                _assert_clean(result, where)
            else:
                assert isinstance(e, ValueError) and _raise_site(e).startswith(LABKIT_DIR), \
                    f"{where} raised a raw {type(e).__name__} in {_raise_site(e)}: {e}"


# ------------------------------------------------------------------------------------------------
# Several arguments at once (seeded random mixes)
# ------------------------------------------------------------------------------------------------
GARBAGE = [None, True, False, "", "1e3", "False", "nan", "all_reduce", "bf16", "∞", 0, 1, 3, -1, -2, 2**70,
           0.0, -0.0, 0.5, 1.5, -1e-9, 5e-324, 1.7976931348623157e308, NAN, INF, -INF, np.int64(3), np.int32(-2),
           np.float64(0.5), np.float64(NAN), np.bool_(True), [], [1, 2], [NAN], (), {}, {1: 1.0}, object()]
MIXES_PER_CALLABLE = 60
SEED = 13


def _mixes(spec: Spec, rng: np.random.Generator):
    """Seeded argument mixes: each parameter keeps its baseline, or takes a bad value of its own kind,
    or any value from GARBAGE (each with probability 1/3)."""
    for _ in range(MIXES_PER_CALLABLE):
        changes = {}
        for p, kind in spec.kinds.items():
            roll = rng.integers(3)
            if roll == 1:
                changes[p] = BAD[kind][rng.integers(len(BAD[kind]))][1]
            elif roll == 2:
                changes[p] = GARBAGE[rng.integers(len(GARBAGE))]
        yield changes


@pytest.mark.parametrize("spec", WITH_KINDS, ids=lambda s: s.name)
def test_random_argument_mixes_never_escape(spec):
    """Random mixes of good and bad arguments (several bad at once): a clean result or a one-line labkit
    ValueError naming one of the parameters, whatever the combination."""
    rng = np.random.default_rng([SEED, SPECS.index(spec)])
    for changes in _mixes(spec, rng):
        result, e = _call(spec, **changes)
        where = f"{spec.name}({changes!r})"
        if e is None:
            _assert_clean(result, where)
            continue
        assert isinstance(e, ValueError), f"{where} raised a raw {type(e).__name__}: {e}"
        assert _raise_site(e).startswith(LABKIT_DIR), f"{where}: raised in {_raise_site(e)}: {e}"
        assert any(p in str(e) for p in spec.kinds), f"{where}: the message names no parameter: {e}"
        assert "\n" not in str(e).strip(), f"{where}: message is not one line: {e!r}"


def fuzz_case_count() -> int:
    """Calls this file makes (for the report): baselines, bad values, NumPy twins, extremes, mixes."""
    n = len(SPECS) + MIXES_PER_CALLABLE * len(WITH_KINDS)
    for s, p, kind in CASES:
        n += len(BAD[kind]) + len(_numpy_twins(kind, s.args.get(p))) + len(_extremes(kind))
    return n


# ------------------------------------------------------------------------------------------------
# Measurement functions: refusals happen before anything is timed, launched or imported
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call,param", [
    (lambda: labkit.flops.count_flops(lambda x: x, 1, backward="False"), "backward"),
    (lambda: labkit.flops.count_flops("model", 1), "model"),
    (lambda: labkit.model.shapes.compare(lambda x: x, 1, "gpt2-124m"), "shape"),
    (lambda: labkit.model.shapes.compare(lambda x: x, 1, SHAPE, method="6n"), "method"),
    (lambda: labkit.model.shapes.compare(lambda x: x, 1, SHAPE), "tokens"),
    (lambda: labkit.model.shapes.compare(lambda x: x, 1, SHAPE, tokens=0), "tokens"),
    (lambda: labkit.memory.deepspeed.deepspeed_params("model"), "model"),
    (lambda: labkit.measure.scaling.measure_scaling(None, nprocs=(1, 2.5)), "nprocs"),
    (lambda: labkit.measure.scaling.measure_scaling(None, nprocs="12"), "nprocs"),
    (lambda: labkit.measure.scaling.measure_scaling(None, mode="fast"), "mode"),
    (lambda: labkit.measure.scaling.measure_scaling(None, threads_per_rank=0), "threads_per_rank"),
    (lambda: labkit.measure.scaling.measure_scaling(None, timeout_s=float("nan")), "timeout_s"),
    (lambda: labkit.kernels.roofline.time_matmul(8, 8, 8, dtype="fp12"), "dtype"),
    (lambda: labkit.kernels.roofline.time_matmul(8, 8, 8, repeats=0), "repeats"),
    (lambda: labkit.kernels.roofline.time_matmul(8, 8, 8.5), "k"),
    (lambda: labkit.kernels.roofline.time_matmul(8, 8, 8, min_time_s=-1), "min_time_s"),
    (lambda: labkit.kernels.roofline.sweep_matmul([(8, 8, 0)], peak_flops=1e12, bandwidth=1e10), "k"),
    (lambda: labkit.kernels.roofline.sweep_matmul([(8, 8)], peak_flops=1e12, bandwidth=1e10), "shape"),
    (lambda: labkit.kernels.roofline.sweep_matmul(None, peak_flops="1e12", bandwidth=1e10), "peak_flops"),
    (lambda: labkit.kernels.roofline.sweep_matmul(None, peak_flops=1e12, bandwidth=1e10, fast="yes"), "fast"),
])
def test_measurements_refuse_before_measuring(call, param):
    with pytest.raises(ValueError, match=param):
        call()


# ------------------------------------------------------------------------------------------------
# The cases issue #13 reported, by name
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call,param", [
    (lambda: labkit.memory.estimate.activation_bytes(SHAPE, 1, seq_len=-100), "seq_len"),
    (lambda: labkit.memory.estimate.activation_bytes(SHAPE, 1, seq_len=0), "seq_len"),     # not the default
    (lambda: labkit.memory.estimate.activation_bytes(SHAPE, 1, dtype_bytes=0), "dtype_bytes"),
    (lambda: labkit.memory.estimate.model_state_bytes(10**9, strategy="fsdp_hybrid", n_ranks=8, shard_size=-2),
     "shard_size"),
    (lambda: labkit.memory.buffers.comm_buffer_bytes(10**9, strategy="zero3", unit_params="x"), "unit_params"),
    (lambda: labkit.comm.models.hierarchical_time("broadcast", 1e6, 16, alpha=1e-6, beta=1e-10, ranks_per_node=8,
                                                  alpha_inter=-1.0, beta_inter=1e-10), "alpha_inter"),
    (lambda: labkit.comm.models.hierarchical_time("all_reduce", 1e6, 16, alpha=1e-6, beta=1e-10, ranks_per_node=16,
                                                  alpha_inter=NAN, beta_inter=1e-10), "alpha_inter"),
    (lambda: labkit.comm.models.hierarchical_time("all_gather", 1e6, 8, alpha=1e-6, beta=1e-10, ranks_per_node=1,
                                                  alpha_inter=1e-5, beta_inter=-1.0), "beta_inter"),
    (lambda: labkit.comm.models.fit_alpha_beta([1e3, NAN, 1e5], [1e-4, 2e-4, 1e-3]), "sizes_bytes"),
    (lambda: labkit.flops.n_params(SHAPE, embeddings="False"), "embeddings"),
    (lambda: labkit.flops.flops_per_step(SHAPE, 4096, hardware="no"), "hardware"),
    (lambda: labkit.flops.flops_per_step(SHAPE, 1.5), "tokens"),
    (lambda: labkit.flops.flops_per_step(SHAPE, np.array([1, 2])), "tokens"),
    (lambda: labkit.comm.models.tree_time("all_reduce", 1e6, 8, alpha=0, beta=1e-10, pipelined="False"), "pipelined"),
    (lambda: labkit.flops.preset("gpt2-124m", bias="False"), "bias"),
    (lambda: labkit.measure.scaling.speedup("1e3", 1.0), "t1_s"),
    (lambda: labkit.perf.cost.wallclock_s(True, 1.0), "tokens"),
    (lambda: labkit.kernels.roofline.ridge_point(1e15, "1e3"), "bandwidth"),
    (lambda: labkit.perf.cost.training_cost(tokens=1e9, flops_per_token=1e9, n_devices=1, tokens_per_s=1e3, pue="x"),
     "pue"),
])
def test_issue_13_cases(call, param):
    with pytest.raises(ValueError, match=param):
        call()


def test_numpy_counts_and_flags_accepted_as_in_the_issue():
    assert labkit.flops.mfu.mfu(tokens_per_s=1e5, flops_per_token=1e9, n_devices=np.int64(2), peak_flops=1e15) == \
        labkit.flops.mfu.mfu(tokens_per_s=1e5, flops_per_token=1e9, n_devices=2, peak_flops=1e15)
    assert labkit.flops.n_params(SHAPE, embeddings=np.bool_(False)) == labkit.flops.n_params(SHAPE, embeddings=False)
    assert labkit.flops.flops_per_step(SHAPE, np.int64(4096)) == labkit.flops.flops_per_step(SHAPE, 4096)


# ---------------------------------------------------------------- issue #28: flags and counts inside configs
_LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=224, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=2, vocab_size=512, max_position_embeddings=32)


@pytest.mark.parametrize("key", ["attention_bias", "mlp_bias", "tie_word_embeddings"])
def test_hf_config_string_false_is_refused_not_read_as_true(key):
    """``attention_bias='false'`` was read as True (bool('false'))."""
    with pytest.raises(ValueError, match=rf"{key} must be True or False, got str 'false'"):
        labkit.model.shapes.from_hf_config(dict(_LLAMA, **{key: "false"}))


def test_integrations_config_string_false_is_refused():
    """``meter_for``'s shape reader took tie_word_embeddings='false' as True."""
    from labkit.integrations.shapes import shape_from_config

    cfg = types.SimpleNamespace(**_LLAMA, tie_word_embeddings="false")
    with pytest.raises(ValueError, match=r"tie_word_embeddings must be True or False"):
        shape_from_config(cfg)


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size"])
def test_hf_config_counts_past_any_model_are_refused_not_overflowed(key):
    """A config with 10**400 layers ended in an OverflowError traceback from the FLOP count."""
    with pytest.raises(ValueError, match=rf"cfg {key}=<int of 401 digits> is not valid"):
        labkit.model.shapes.from_hf_config(dict(_LLAMA, **{key: 10**400}))
    from labkit.integrations.shapes import shape_from_config

    if key in ("num_hidden_layers", "hidden_size", "vocab_size"):
        with pytest.raises(ValueError, match=r"config .*=<int of 401 digits> is not valid"):
            shape_from_config(types.SimpleNamespace(**dict(_LLAMA, **{key: 10**400})))


@pytest.mark.parametrize("call,match", [
    (lambda: labkit.measure.claims.stored_claims({}), r"nb must be a parsed notebook .*got keys \[\]"),
    (lambda: labkit.measure.claims.stored_claims(None), r"nb must be a parsed notebook .*got NoneType"),
    (lambda: labkit.measure.claims.stored_claims({"cells": [3]}), r"cells\[0\] is int"),
    (lambda: labkit.teaching.faults.public_record(None, 3), r"record must be a labkit.record.RunRecord, got NoneType"),
])
def test_claims_and_faults_refuse_what_they_cannot_read(call, match):
    """``stored_claims({})`` raised KeyError, ``public_record(None)`` AttributeError."""
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------------
# Issue #37: every public callable of EVERY labkit package is fuzzed above or listed in
# tests/data/fuzz_guard_listed.txt (not yet a row: measures, launches, results, notebooks' helpers).
# A new public name anywhere fails here until it gets a row or a line there.
# ------------------------------------------------------------------------------------------------
LISTED_FILE = os.path.join(os.path.dirname(__file__), "data", "fuzz_guard_listed.txt")


def _every_public_callable() -> dict[str, object]:
    """{"module.name": object}: each module's ``__all__``, or its public functions and classes defined there."""
    import importlib
    import pkgutil

    seen: dict[int, tuple[str, object]] = {}
    for info in sorted(pkgutil.walk_packages(labkit.__path__, "labkit."), key=lambda m: m.name):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        names = getattr(mod, "__all__", None)
        if names is None:
            names = [n for n, o in vars(mod).items() if not n.startswith("_") and getattr(o, "__module__", None)
                     == mod.__name__ and (inspect.isfunction(o) or inspect.isclass(o))]
        for n in names:
            obj = getattr(mod, n, None)
            if callable(obj) and id(obj) not in seen:
                seen[id(obj)] = (f"{mod.__name__.removeprefix('labkit.')}.{n}", obj)
    return dict(seen.values())


def test_every_public_callable_of_every_package_is_fuzzed_or_listed():
    listed = {line.split("#")[0].strip() for line in open(LISTED_FILE) if line.split("#")[0].strip()}
    every = _every_public_callable()
    fuzzed = {id(s.fn) for s in SPECS}
    named = {id(o) for q, o in _public_callables().items() if q in MEASURES | RESULTS}  # by object: a face
    covered = {q for q, o in every.items() if id(o) in fuzzed | named} | (MEASURES | RESULTS)  # may name it
    missing = sorted(q for q in every if q not in covered and q not in listed)
    assert not missing, f"public callables with no fuzz row and no line in {LISTED_FILE}: {missing}"
    stale = sorted(listed - set(every))
    assert not stale, f"{LISTED_FILE} lists names labkit no longer has: {stale}"
