"""The capstone's mystery workloads (lab 12): one seeded bottleneck, its knobs hidden, to be named and fixed.

A learner gets ``Workload(seed)``: a short single-process training job of the reference trainer (the
``small`` GPT, sequences of 8 tokens, a global batch of 8 sequences) with one bottleneck chosen by the
seed. What the learner sees — :meth:`Workload.run`'s record, :meth:`Workload.options` — keeps the
trainer options (micro-batch, accumulation, workers, checkpointing …) and drops the workload's hidden
environment (``inject``, ``data_slowdown_s``, ``memory_budget_mb`` and their sizes, :data:`HIDDEN`), so
two workloads' records differ in what the trainer did, not in a label. The learner names the family from
evidence (:func:`labkit.diagnose.diagnose` on a traced run) and makes the job at least 20 % faster by
changing **trainer options only** — never the environment, the model, the sequence length or the global
batch (micro-batch × accumulation × data-parallel ranks) — proven with :func:`labkit.ab.ab_train` in the
same run. The grader recovers the bottleneck from the seed with :func:`mystery_of`.

=============  ===========  ======================================================================  ============
mystery        family       what the job does (hidden environment / visible options)                a fix
=============  ===========  ======================================================================  ============
slow_loader    data         every sample takes ``SLOW_SAMPLE_STEPS`` clean steps ÷ 8 to load        loader workers
                            (hidden); ``num_workers=0``
tiny_micro     compute      micro-batches of one sequence accumulated 8 times: GEMMs of 8 rows,     one micro-
                            per-op overhead dominates (chapter 15)                                  batch of 8
act_budget     memory       an activation budget of ``BUDGET_SAMPLES`` sequences' saved tensors     recompute
                            (hidden): the trainer halves the requested micro-batch of 8 until it    (chapter 21)
                            fits — one sequence, accumulated 8 times (:func:`labkit.train.inject.   so more fit
                            plan`; recomputation shrinks what a sequence saves, so more fit)
=============  ===========  ======================================================================  ============

Sizes: the ``small`` GPT at 8 sequences × 8 tokens per step, so a micro-batch of one sequence is an 8-row GEMM
and per-op overhead, not FLOPs, sets its time. Measured with 1 thread on 2 cores at load 23–30 (other jobs
beside it), interleaved A/B of whole runs (:meth:`Workload.ab`), median step times: slow loader 1.23 s →
0.48 s with 4 workers (2.6×); activation budget 1.23 s → 0.76 s with full recomputation (4 sequences fit
where 1 did: 1.6×, the smallest effect — the recomputed forward costs back part of it); one-sequence
micro-batches ≈ 4× (2.55 s → 0.64 s at a global batch of 16). Every effect is well beyond the ≥ 20 % the
lab asks for; the grader's re-measurement (one short run of each) asks ≥ 1.1× on its own machine.

Why no communication or scheduling mystery: both need ranks that wait for each other (2 gloo ranks,
each A/B call a fresh launch: minutes on a loaded 2-core machine, past the lab's 5 minutes), and the
scheduling faults of lab 2 (a host stall, a straggler rank) are not fixable by a trainer option — their
fix is outside the job. They are diagnosed in lab 2 and chapter 14, fixed in chapters 19, 23 and 27.

Taught in lab 12 (the capstone); the families in chapter 2, the diagnosis in chapter 14.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from labkit import checks

__all__ = ["MYSTERIES", "Mystery", "Workload", "HIDDEN", "FIXED", "mystery_of", "seed_for", "global_batch",
           "check_options"]


@dataclass(frozen=True)
class Mystery:
    """One capstone bottleneck: its name, family (chapter 2), and what it does. Taught in lab 12."""

    name: str
    family: str
    what: str


MYSTERIES = {m.name: m for m in (
    Mystery("slow_loader", "data", "every sample is slow to load and the loader has no workers"),
    Mystery("tiny_micro", "compute", "micro-batches of one sequence, accumulated to the global batch"),
    Mystery("act_budget", "memory", "an activation budget forces the micro-batch down to one sequence"),
)}

GLOBAL_BATCH = 8            # sequences per optimizer step (1 rank)
SEQ_LEN = 8                 # tokens per sequence: small GEMMs make per-op overhead visible
MODEL = "small"
SLOW_SAMPLE_STEPS = 2.0     # the slow loader's batch takes this many clean steps to load
BUDGET_SAMPLES = 1.5        # the activation budget: this many sequences' saved tensors (no recomputation)
# the workload's environment: never shown, never changed by a fix
HIDDEN = ("inject", "inject_share", "inject_steps", "data_slowdown_s", "data_slowdown_s_used", "memory_budget_mb",
          "comm_pad_mb", "comm_pad_mb_used", "host_stall_s", "host_stall_s_used", "straggler_rank", "profile_dir",
          "label")
# what defines the job: a fix may not change these (nor the global batch, micro_batch × accum)
FIXED = HIDDEN + ("model", "seq_len", "seed", "steps", "warmup_steps", "device", "train_sequences",
                  "dataset", "packing", "fail_at_step", "resume_from", "val_every", "val_sequences", "peak_flops")


def _digest(seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"labkit-capstone:{seed}".encode()).digest()[:8], "big")


def mystery_of(seed: int) -> Mystery:
    """The bottleneck of capstone workload ``seed`` — what the grader checks against; a learner finds it
    from evidence. Taught in lab 12."""
    names = sorted(MYSTERIES)
    return MYSTERIES[names[_digest(checks.count("seed", seed, at_least=0)) % len(names)]]


def seed_for(name: str, start: int = 0) -> int:
    """The smallest seed ≥ ``start`` whose workload hides ``name`` (instructors, tests). Taught in lab 12."""
    checks.one_of("name", name, tuple(sorted(MYSTERIES)))
    seed = checks.count("start", start, at_least=0)
    while mystery_of(seed).name != name:
        seed += 1
    return seed


def global_batch(cfg: dict) -> int:
    """Sequences per optimizer step of a config dict (a TrainConfig's, or a record's: what the trainer ran
    after a memory budget shrank the micro-batch, ``accum`` grown to match): micro_batch × accum (× ranks
    for DP; the capstone runs on one). Taught in lab 12 (chapter 15's accounting)."""
    mb, acc = cfg.get("micro_batch"), cfg.get("accum")
    if isinstance(mb, bool) or isinstance(acc, bool) or not isinstance(mb, int) or not isinstance(acc, int):
        raise ValueError(f"micro_batch={mb!r} and accum={acc!r} must be integers to count the global batch "
                         "(accum='adaptive' changes it from step to step: not a fix of this workload)")
    return mb * acc


def check_options(options: dict) -> dict:
    """``options`` if every key is a trainer option a fix may change (not :data:`FIXED`, not unknown);
    else a ValueError naming the keys. Taught in lab 12."""
    from labkit.train import TrainConfig

    if not isinstance(options, dict):
        raise checks.ArgumentTypeError(f"options must be a dict of TrainConfig fields, got {type(options).__name__}")
    unknown = sorted(k for k in options if k not in TrainConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"options {unknown} are not TrainConfig fields")
    fixed = sorted(k for k in options if k in FIXED)
    if fixed:
        raise ValueError(f"options {fixed} define the workload (its environment, model, data or length), not how "
                         f"it is trained: a fix may change trainer options only, never {sorted(FIXED)}")
    return options


class Workload:
    """Capstone workload ``seed``: its public options, runs and A/Bs; the bottleneck stays hidden (repr:
    the seed only). ``steps``/``warmup_steps``: of every run (a traced run records the last
    ``steps - warmup_steps``). Taught in lab 12."""

    def __init__(self, seed: int, *, steps: int = 5, warmup_steps: int = 2, device: str = "cpu"):
        self.seed = checks.count("seed", seed, at_least=0)
        self.steps = checks.count("steps", steps, at_least=2)
        self.warmup_steps = checks.count("warmup_steps", warmup_steps, at_least=0, at_most=steps - 1)
        self.device = device
        self._mystery = mystery_of(self.seed)
        self._slow_s = None

    def __repr__(self) -> str:
        return f"Workload(seed={self.seed}, global batch {GLOBAL_BATCH} × {SEQ_LEN} tokens, {MODEL} GPT)"

    def _env(self) -> dict:
        """The hidden environment and the starting trainer options of this workload."""
        name = self._mystery.name
        if name == "tiny_micro":
            return dict(micro_batch=1, accum=GLOBAL_BATCH)
        if name == "act_budget":
            from labkit.train.inject import activation_bytes_per_sample
            from labkit.units import MIB

            per = activation_bytes_per_sample(self._base(), _device(self.device))
            return dict(memory_budget_mb=BUDGET_SAMPLES * per / MIB)
        if self._slow_s is None:      # the slow loader: sized to this machine's clean step, once
            from labkit.train import train

            clean = train(self._base().replace(steps=3, warmup_steps=1, label="clean"))
            self._slow_s = round(SLOW_SAMPLE_STEPS * clean.step_time.median / GLOBAL_BATCH, 5)
        return dict(data_slowdown_s=self._slow_s, num_workers=0)

    def _base(self):
        from labkit.train import TrainConfig

        return TrainConfig(model=MODEL, seq_len=SEQ_LEN, micro_batch=GLOBAL_BATCH, accum=1, steps=self.steps,
                           warmup_steps=self.warmup_steps, seed=self.seed, device=self.device, label="workload")

    def config(self, **options):
        """The full :class:`~labkit.train.TrainConfig` of this workload with trainer ``options`` changed
        (:func:`check_options`). It shows the hidden environment: the grader's and the tests' view."""
        check_options(options)
        return self._base().replace(**self._env()).replace(**options)

    def options(self) -> dict:
        """The trainer options this workload starts from (the public part of its config). Taught in lab 12."""
        return public_config(self.config().to_dict())

    def run(self, profile_dir=None, **options):
        """Train the workload once (``options`` changed) and return its public record: a
        :class:`~labkit.record.RunRecord` whose config holds no hidden knob and names ``capstone_seed``.
        ``profile_dir``: write the run's Chrome trace there (older ``*.json`` traces removed first)."""
        from pathlib import Path

        from labkit.train import train

        cfg = self.config(**options)
        if profile_dir is not None:
            out = Path(profile_dir)
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("*.json"):
                old.unlink()
            cfg = cfg.replace(profile_dir=str(out), profile_steps=self.steps - self.warmup_steps)
        rec = train(cfg)
        rec.config = public_config(rec.config)
        rec.config["capstone_seed"] = self.seed
        rec.label = "capstone"
        return rec

    def ab(self, options: dict, *, rounds: int = 3, warmup: int = 0, timeout_s: float = 600):
        """:func:`labkit.ab.ab_train` of this workload as given (A) against it with ``options`` (B), one
        median step time per run. Taught in lab 12."""
        from labkit.ab import ab_train

        return ab_train(self.config().replace(label="workload"), self.config(**options).replace(label="fixed"),
                        rounds=rounds, warmup=warmup, timeout_s=timeout_s)


def public_config(cfg: dict) -> dict:
    """A config dict without the :data:`HIDDEN` knobs. Taught in lab 12."""
    return {k: v for k, v in cfg.items() if k not in HIDDEN}


def _device(device):
    from labkit.hardware import resolve_device

    return resolve_device(device)
