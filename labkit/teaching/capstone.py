"""The capstone's mystery workloads (lab 12): one seeded bottleneck, its knobs hidden, to be named and fixed.

A learner gets ``Workload(seed)``: a short training job of the reference trainer (the ``small`` GPT,
sequences of 8 tokens, a global batch of 8 sequences; one process, or 2 gloo ranks for the slow link) with
one bottleneck chosen by the seed, one mystery per family of chapter 2. What the learner sees —
:meth:`Workload.run`'s record, :meth:`Workload.options` — keeps the trainer options (micro-batch,
accumulation, gradient sync, workers, checkpointing, monitoring …) and drops the workload's hidden
environment (``inject``, ``data_slowdown_s``, ``memory_budget_mb``, the slow link and their sizes,
:data:`HIDDEN`), so two workloads' records differ in what the trainer did, not in a label. The learner names
the family from evidence (:func:`labkit.diagnose.diagnose` on a traced run) and makes the job at least 20 %
faster by changing **trainer options only** — never the environment, the model, the sequence length or the
global batch (micro-batch × accumulation × data-parallel ranks) — proven with :func:`labkit.measure.ab.ab_train` in
the same run.

Which bottleneck a workload hides is drawn from ``seed`` (:mod:`labkit.teaching.tickets`): a learner's *ticket* (``"SEED-TAG"``,
tagged with the instructor's key by ``labkit release --key-file``) or a bare practice number. No public name maps
a seed to its bottleneck, and a workload object shows none: its repr names the seed only, it exposes no options,
configuration, rank count or family before a run. (Its own code can be read, so this is no wall: the points rest
on the learner's evidence — the family named must be one ``diagnose`` finds on the learner's traced run, the
justification must cite a figure of that run, the speed-up is re-derived from the learner's A/B; the grader never
re-measures.)

=============  =============  ==================================================================  ============
mystery        family         what the job does (hidden environment / visible options)            a fix
=============  =============  ==================================================================  ============
slow_loader    data           every sample takes ``SLOW_SAMPLE_STEPS`` clean steps ÷ 8 to load    loader workers
                              (hidden); ``num_workers=0``
tiny_micro     compute        micro-batches of one sequence accumulated 8 times: GEMMs of 8       one micro-
                              rows, per-op overhead dominates (chapter 15)                        batch of 8
slow_link      communication  2 ranks, one per "node", joined by a link on which one fp32         ``no_sync``
                              gradient all-reduce takes ``LINK_SYNC_STEPS`` clean steps           (chapter 15)
                              (hidden: :mod:`labkit.train.slow_link`, ``link_overlap``: the delay
                              sits in the communication thread, so the trace shows it as exposed
                              communication); 1 sequence × 4 micro-batches per rank with
                              ``no_sync=False``: the gradients cross the link after every
                              micro-batch, 4 times a step
act_budget     memory         an activation budget of ``BUDGET_SAMPLES`` sequences' saved         recompute
                              tensors (hidden): the trainer halves the requested micro-batch of   (chapter 21)
                              8 until it fits — one sequence, accumulated 8 times
                              (:func:`labkit.train.inject.plan`; recomputation shrinks what a     so more fit
                              sequence saves, so more fit)
host_stats     scheduling     ``grad_stats=True``: chapter 18's per-layer gradient statistics,    ``grad_stats
                              NumPy on the host, every step — the compute thread runs no op        =False``
                              for ≈ 40 % of the step (the diagnosis' host-gap rule)
=============  =============  ==================================================================  ============

Sizes: the ``small`` GPT at 8 sequences × 8 tokens per step, so a micro-batch of one sequence is an 8-row GEMM
and per-op overhead, not FLOPs, sets its time. Measured with 1 thread on 2 cores, interleaved A/B of whole
runs (:meth:`Workload.ab`, 6 steps, 2 of them warm-up), median step times. At load 23–30: slow loader 1.23 s →
0.48 s with 4 workers (2.6×); activation budget 1.23 s → 0.76 s with full recomputation (4 sequences fit
where 1 did: 1.6× — the recomputed forward costs back part of it); one-sequence micro-batches ≈ 4× (2.55 s →
0.64 s at a global batch of 16). At load 8–15, 7 rounds: slow link 957 ms → 452 ms with ``no_sync=True``
(2.1×, resolution ±13 %; a short pair of runs 2.7×) — the link is sized to one clean step per
all-reduce, so the given job pays 4 of them, the fix 1; host statistics 111 ms → 60 ms without them
(1.85×, 15 rounds, resolution ±29 %; short pairs of runs 1.8–3.8× in six tries). The host-statistics fix is the one a
loaded machine hides best: its steps are short (≈ 0.06–0.4 s), the effect is CPU work against CPU work
(1.4–2.7×), and when other jobs start and stop on 2 cores the runs of one config spread up to 10× (max ÷ min
of an A/B's job runs). Measured 2026-12-02, the learner's A/B of ``grad_stats=False``, 6 steps (2 warm-up),
beside other engineers' torch (load 3–10) and, for most, a bursty load of 4–14 processes busy and idle for
0.3–4 s at random (load 4–16): at lab 12's 7 rounds all 13 A/Bs put the fix at 1.4–2.5×, but 6 read "no
difference at this resolution" (resolutions ±49–132 %); four times longer runs (16 timed steps) did no
better — 6 of 12 resolved, at 2–3× the time: the noise is the load moving between runs, which a longer run
spreads over more of, not a burst inside one. More rounds resolve it: lab 12's solution asks
``max_rounds=4 × ROUNDS`` (:func:`labkit.measure.ab.ab_train` doubles the rounds while the verdict is "no
difference", up to 28), and 5 of 5 such A/Bs (load 4 with the bursty load) said "faster" (1.5–2.7×,
resolutions ±29–52 %), 2 after 14 rounds and 3 after 28 (50–170 s each). Every effect is well beyond the
≥ 20 % the lab asks for. The grader does not measure again: a loaded grading machine would decide a learner's
point; it re-derives the learner's own A/B from its recorded samples.

The slow link is bandwidth-only (α = 0: :func:`labkit.train.slow_link.delay_s`), so the size of DDP's buckets
changes nothing of its delay — "too-small buckets on a slow link" would need a per-message latency; the fault
here is syncing every micro-batch (bigger micro-batches fix it too). A synchronous checkpoint every few steps
(chapter 27) is not a mystery: the loop records a save's stall apart from the step time (``record.extra
["checkpoint"]``), so a step-time A/B cannot see ``checkpoint_mode="async"`` win.

Taught in lab 12 (the capstone); the families in chapter 2, the diagnosis in chapter 14.
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks
from labkit.teaching import tickets

__all__ = ["MYSTERIES", "Mystery", "Workload", "HIDDEN", "FIXED", "GLOBAL_BATCH", "global_batch", "check_options"]


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
    Mystery("slow_link", "communication", "2 ranks over a slow link, gradients all-reduced after every micro-batch"),
    Mystery("host_stats", "scheduling", "per-layer gradient statistics computed on the host inside every step"),
)}

# the order seeds draw from (fixed, so a seed keeps its mystery: seed 0, the course's CI seed, the slow loader —
# its fix is a sleep moved off the training thread, an effect a loaded machine cannot hide)
DRAW = ("act_budget", "slow_loader", "slow_link", "host_stats", "tiny_micro")
assert sorted(DRAW) == sorted(MYSTERIES)

GLOBAL_BATCH = 8            # sequences per optimizer step (over every data-parallel rank)
SEQ_LEN = 8                 # tokens per sequence: small GEMMs make per-op overhead visible
MODEL = "small"
SLOW_SAMPLE_STEPS = 2.0     # the slow loader's batch takes this many clean steps to load
BUDGET_SAMPLES = 1.5        # the activation budget: this many sequences' saved tensors (no recomputation)
LINK_RANKS = 2              # the slow link's job: this many gloo ranks, one per "node"
LINK_SYNC_STEPS = 1.0       # one gradient all-reduce over the link takes this many clean steps
# the workload's environment: never shown, never changed by a fix
HIDDEN = ("inject", "inject_share", "inject_steps", "data_slowdown_s", "data_slowdown_s_used", "memory_budget_mb",
          "comm_pad_mb", "comm_pad_mb_used", "host_stall_s", "host_stall_s_used", "host_stall_reps_used", "straggler_rank", "straggler_by",
          "profile_dir",
          "ranks_per_node", "inter_node_gbit_s", "link_overlap", "label")
# what defines the job: a fix may not change these (nor the global batch, micro_batch × accum)
FIXED = HIDDEN + ("model", "seq_len", "seed", "steps", "warmup_steps", "device", "train_sequences",
                  "dataset", "packing", "fail_at_step", "resume_from", "val_every", "val_sequences", "peak_flops")


LAB = "lab12_capstone"


def _mystery_of(seed) -> Mystery:
    """The bottleneck a ticket or practice seed draws (private: the workload's own injection, and the grader's)."""
    return MYSTERIES[DRAW[tickets.draw(LAB, seed, len(DRAW))]]


def _graded_mystery(seed, key: str | None) -> Mystery:
    """The grader's truth: with the instructor's ``key``, ``seed`` must be a ticket that key issued
    (:func:`labkit.teaching.tickets.verify`, ValueError otherwise); without one (practice, the course's CI), any seed."""
    if key is not None:
        tickets.verify(key, LAB, seed)
    return _mystery_of(seed)


def _seed_for(name: str, start: int = 0) -> int:
    """The smallest practice seed ≥ ``start`` whose workload hides ``name`` (the tests' and instructors' tool)."""
    checks.one_of("name", name, tuple(sorted(MYSTERIES)))
    seed = checks.count("start", start, at_least=0)
    while _mystery_of(seed).name != name:
        seed += 1
    return seed


def global_batch(cfg: dict) -> int:
    """Sequences per optimizer step of a config dict (:meth:`Workload.options`, or a capstone record's: what
    the trainer ran after a memory budget shrank the micro-batch, ``accum`` grown to match): micro_batch ×
    accum × ``dp_ranks`` (the data-parallel ranks; 1 when absent). Taught in lab 12 (chapter 15's accounting)."""
    mb, acc, dp = cfg.get("micro_batch"), cfg.get("accum"), cfg.get("dp_ranks", 1)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (mb, acc, dp)):
        raise ValueError(f"micro_batch={mb!r}, accum={acc!r} and dp_ranks={dp!r} must be integers to count the "
                         "global batch (accum='adaptive' changes it from step to step: not a fix of this workload)")
    return mb * acc * dp


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
    """Capstone workload ``seed`` (a ticket ``"SEED-TAG"`` from the instructor, or a practice number): its runs
    and A/Bs; the bottleneck stays hidden — the repr names the seed only, and nothing public tells the options,
    ranks or environment before a run (a run's record holds what the trainer did). ``steps``/``warmup_steps``:
    of every run (a traced run records the last ``steps - warmup_steps``). Taught in lab 12."""

    def __init__(self, seed, *, steps: int = 5, warmup_steps: int = 2, device: str = "cpu"):
        tickets.parse(seed)                     # a practice seed or a ticket; ValueError naming it otherwise
        self.seed = seed
        self.steps = checks.count("steps", steps, at_least=2)
        self.warmup_steps = checks.count("warmup_steps", warmup_steps, at_least=0, at_most=steps - 1)
        self._nprocs = LINK_RANKS if _mystery_of(seed).name == "slow_link" else 1
        self.device = _rank_device(device, self._nprocs)
        self._clean = None

    def __repr__(self) -> str:
        return f"Workload(seed={self.seed!r}, global batch {GLOBAL_BATCH} × {SEQ_LEN} tokens, {MODEL} GPT)"

    def _clean_s(self) -> float:
        """This machine's clean step of the job (one process, one micro-batch of 8), measured once: what
        the slow loader and the slow link are sized to."""
        if self._clean is None:
            from labkit.train import train

            self._clean = train(self._base().replace(steps=3, warmup_steps=1, label="clean")).step_time.median
        return self._clean

    def _env(self) -> dict:
        """The hidden environment and the starting trainer options of this workload."""
        name = _mystery_of(self.seed).name
        if name == "tiny_micro":
            return dict(micro_batch=1, accum=GLOBAL_BATCH)
        if name == "host_stats":       # chapter 18's gradient monitor left on: NumPy on the host every step
            return dict(grad_stats=True)
        if name == "act_budget":
            from labkit.train.inject import activation_bytes_per_sample
            from labkit.units import MIB

            per = activation_bytes_per_sample(self._base(), _device(self.device))
            return dict(memory_budget_mb=BUDGET_SAMPLES * per / MIB)
        if name == "slow_link":        # 2 ranks, 1 per "node"; every micro-batch's gradients cross the link
            return dict(parallel="ddp", micro_batch=1, accum=GLOBAL_BATCH // self._nprocs, no_sync=False,
                        ranks_per_node=1, inter_node_gbit_s=self._link_gbit_s(), link_overlap=True)
        return dict(data_slowdown_s=round(SLOW_SAMPLE_STEPS * self._clean_s() / GLOBAL_BATCH, 5), num_workers=0)

    def _link_gbit_s(self) -> float:
        """The link speed at which one all-reduce of the model's fp32 gradients (:func:`labkit.train.slow_link.
        delay_s`) takes ``LINK_SYNC_STEPS`` clean steps."""
        from labkit.model.config import gpt_config
        from labkit.model.gpt import GPT
        from labkit.train.slow_link import delay_s

        nbytes = 4 * GPT(gpt_config(MODEL, seq_len=SEQ_LEN)).n_params()
        at_1 = delay_s(nbytes, self._nprocs, 1.0)          # seconds at 1 Gb/s: the delay scales as 1 / speed
        return round(at_1 / (LINK_SYNC_STEPS * self._clean_s()), 4)

    def _base(self):
        from labkit.train import TrainConfig

        return TrainConfig(model=MODEL, seq_len=SEQ_LEN, micro_batch=GLOBAL_BATCH, accum=1, steps=self.steps,
                           warmup_steps=self.warmup_steps, seed=tickets.parse(self.seed)[0], device=self.device,
                           label="workload")

    def _config(self, **options):
        """The full :class:`~labkit.train.TrainConfig` of this workload with trainer ``options`` changed
        (:func:`check_options`; a ValueError naming both global batches if they change it). It holds the hidden
        environment: the grader's and the tests' view, never the learner's."""
        check_options(options)
        cfg = self._base().replace(**self._env())
        new = cfg.replace(**options)
        if options:
            given, fixed = (self._public(c.to_dict()) for c in (cfg, new))
            if global_batch(fixed) != global_batch(given):
                raise ValueError(
                    f"options {options} make a global batch of {global_batch(fixed)} sequences (micro_batch "
                    f"{fixed['micro_batch']} × accum {fixed['accum']} × {fixed['dp_ranks']} data-parallel rank(s)); "
                    f"the job's is {global_batch(given)}: a run or A/B of another global batch is another job, "
                    "not a faster one — keep micro_batch × accum at the job's")
        return new

    def _options(self, **options) -> dict:
        """The trainer options this workload starts from (with ``options`` changed) — the public part of its
        config — and ``dp_ranks``: what its run's record holds (the grader's view before a run)."""
        return self._public(self._config(**options).to_dict())

    def _public(self, cfg: dict) -> dict:
        out = public_config(cfg)
        out["dp_ranks"] = self._nprocs // (cfg.get("tp", 1) * cfg.get("pp", 1) * cfg.get("cp", 1))
        return out

    def run(self, profile_dir=None, **options):
        """Train the workload once (``options`` changed: trainer options, the global batch kept) and return its
        public record:
        a :class:`~labkit.record.RunRecord` whose config holds no hidden knob and names ``capstone_seed`` and
        ``dp_ranks``. ``profile_dir``: write the run's Chrome traces there (one per rank; older ``*.json``
        traces removed first)."""
        from pathlib import Path

        cfg = self._config(**options)
        if profile_dir is not None:
            out = Path(profile_dir)
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("*.json"):
                old.unlink()
            cfg = cfg.replace(profile_dir=str(out), profile_steps=cfg.steps - cfg.warmup_steps)
        if self._nprocs == 1:
            from labkit.train import train

            rec = train(cfg)
        else:
            from labkit.train import run

            rec = run(cfg, self._nprocs)
        rec.config = self._public(rec.config)
        rec.config["capstone_seed"] = self.seed
        rec.extra.pop("slow_link", None)        # the link's own counters name the hidden environment
        rec.label = "capstone"
        return rec

    def ab(self, options: dict, *, rounds: int = 3, warmup: int = 0, timeout_s: float = 600,
           max_rounds: int | None = None):
        """:func:`labkit.measure.ab.ab_train` of this workload as given (A) against it with ``options`` (B), one
        median step time per run; a multi-rank workload trains every run in one launch of its ranks
        (``same_ranks=True``); ``max_rounds``: measure longer on an inconclusive verdict (as ``ab_train``).
        ``options`` that change the global batch are refused (ValueError naming both): an A/B compares one job
        trained two ways. Taught in lab 12."""
        from dataclasses import replace

        from labkit.measure.ab import ab_train

        fixed = self._config(**options).replace(label="fixed")     # refuses another global batch
        res = ab_train(self._config().replace(label="workload"), fixed,
                       nprocs=self._nprocs, rounds=rounds, warmup=warmup, timeout_s=timeout_s,
                       same_ranks=self._nprocs > 1, max_rounds=max_rounds)
        runs = tuple({**r, "config": self._public(r["config"]), "extra": {k: v for k, v in r["extra"].items()
                                                                          if k != "slow_link"}} for r in res.runs)
        return replace(res, runs=runs)        # every run's record, the hidden environment left out


def public_config(cfg: dict) -> dict:
    """A config dict without the :data:`HIDDEN` knobs. Taught in lab 12."""
    return {k: v for k, v in cfg.items() if k not in HIDDEN}


def _rank_device(device: str, nprocs: int) -> str:
    """``device`` for a job of ``nprocs`` ranks: a rank per GPU, else the CPU (gloo)."""
    if nprocs == 1 or device == "cpu":
        return device
    import torch

    return device if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs else "cpu"


def _device(device):
    from labkit.hardware import resolve_device

    return resolve_device(device)
