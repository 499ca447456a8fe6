"""Mystery runs: a short DDP run with one fault hidden in it, chosen by a seed (lab 2).

A learner gets ``mystery_run(seed, out_dir)``: a profiled 2-rank gloo run of the reference trainer
with one of the faults below injected (:mod:`labkit.train.inject`). Which one is not printed and not
in the record: the record's config keeps only what every fault shares (model, batch, steps, seed …)
plus ``mystery_seed`` — the injection knobs (``inject``, ``data_slowdown_s``, ``host_stall_s``,
``straggler_rank``, the sizes used) are removed, so the configs of two mystery runs differ only in
their seed. The learner has to find the fault from the evidence — meter phases (chapter 7), the trace
breakdown and the stragglers table (chapters 8–9), :func:`labkit.diagnose.diagnose` (chapter 14) —
and name its family. Which fault a seed hides is drawn through :mod:`labkit.teaching.tickets` (a learner's ticket from the
instructor's key, or a practice number); no public name maps a seed to its fault — the grader's checks do, and with
the key they accept only the tickets it issued. The evidence decides the points (lab 2's q3: the family must be
cited by a figure of the learner's own run).

=============  ==============  ==========================================================================
fault          family          what is injected (sized to one clean step: ``inject_share = 0.5``)
=============  ==============  ==========================================================================
slow_loader    data            the loader sleeps per sample: one clean step of waiting per step
host_stall     scheduling      every rank's thread blocks once per step outside any op (a hidden sync)
straggler      scheduling      one rank (chosen by the seed) blocks once per step; the other waits for it
                               in the gradient all-reduce
extra_sync     communication   an extra, un-overlapped all-reduce per step after backward (an
                               oversized bucket), sized to one clean step at the measured bandwidth
=============  ==============  ==========================================================================

Why no "tiny buckets" fault: on CPU gloo ranks a DDP run with ``bucket_cap_mb=0.005`` (≈ 40 buckets
per step) spends its exposed communication waiting for the other rank's main thread, so
:func:`labkit.diagnose.diagnose` names it scheduling (peer wait), not communication — a fault whose
evidence points to another family is a bad exercise. Compute and memory faults change the batch
(micro-batch, recomputation) and so the record's config; they are taught in chapters 14–15 instead.

Sizes are checked by ``tests/test_faults.py``: for each fault, a live run on 2 loaded CPU cores and
``diagnose``'s primary family (and the stragglers table for ``straggler``).

Lab 8's mystery run is :class:`LoaderJob`: a training job whose loader has no workers and whose samples are slow
by an amount its seed draws (:data:`LOADER_STEPS` clean steps per batch, through :mod:`labkit.teaching.tickets`: a learner's
ticket from the instructor's key, or a practice number). The job shows neither the slowdown nor its size: its repr
names the seed, its records' configs drop ``data_slowdown_s``; the learner reads the wait in the trace and sizes the
workers from the per-sample time the run measured (chapter 22). The grader judges the learner's traces and A/B,
never a size.

Taught in lab 2 (``labs/lab02_profiler``), lab 8 (:class:`LoaderJob`) and chapter 14 (systematic diagnosis).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from labkit import checks
from labkit.record import RunRecord

__all__ = ["FAULTS", "Fault", "MysteryRun", "LoaderJob", "LOADER_OPTIONS", "mystery_run", "public_record"]


@dataclass(frozen=True)
class Fault:
    """One fault of a mystery run: its name, the family chapter 2 files it under, the trainer's
    injection that makes it, and one sentence of what happens. Taught in lab 2."""

    name: str
    family: str
    inject: str
    what: str


FAULTS = {f.name: f for f in (
    Fault("slow_loader", "data", "data", "the data loader sleeps per sample (a slow decode or remote read)"),
    Fault("host_stall", "scheduling", "host",
          "every rank's training thread blocks once per step outside any op (a hidden host sync)"),
    Fault("straggler", "scheduling", "straggler",
          "one rank blocks once per step; the others wait for it inside the gradient all-reduce"),
    Fault("extra_sync", "communication", "comm",
          "an extra all-reduce per step after backward, not overlapped with compute (an oversized bucket)"),
)}

INJECT_SHARE = 0.5          # every fault adds one clean step: share / (1 − share) × clean step = 1 × step
# the injection knobs a mystery record must not show (plus what the trainer records of their sizes)
# (and the trace folder, an absolute path); everything else is the same for every fault
_HIDDEN = ("inject", "inject_share", "inject_steps", "data_slowdown_s", "comm_pad_mb", "host_stall_s", "straggler_rank",
           "straggler_by",
           "data_slowdown_s_used", "comm_pad_mb_used", "host_stall_s_used", "host_stall_reps_used", "micro_batch_requested",
           "profile_dir", "label")


LAB = "lab02_profiler"


def _check_seed(seed) -> int:
    """The number of a practice seed or a ticket (ValueError naming anything else)."""
    from labkit.teaching import tickets

    return tickets.parse(seed)[0]


def _fault_of(seed) -> tuple[Fault, int]:
    """(the fault, the slow rank for a straggler) that a ticket or practice seed draws (private: the run's own
    injection, and the grader's)."""
    from labkit.teaching import tickets

    h = tickets.digest(LAB, seed)
    names = sorted(FAULTS)
    return FAULTS[names[h % len(names)]], (h >> 8) % 2


def _graded_fault(seed, key: str | None) -> tuple[Fault, int]:
    """The grader's truth: with the instructor's ``key`` only a ticket it issued (ValueError otherwise)."""
    from labkit.teaching import tickets

    if key is not None:
        tickets.verify(key, LAB, seed)
    return _fault_of(seed)


def _seed_for(fault: str, start: int = 0) -> int:
    """The smallest practice seed ≥ ``start`` whose mystery run has ``fault`` (the tests' and instructors' tool)."""
    if fault not in FAULTS:
        raise ValueError(f"fault={fault!r} is not valid; choose one of {sorted(FAULTS)}")
    seed = checks.count("start", start, at_least=0)
    while _fault_of(seed)[0].name != fault:
        seed += 1
    return seed


def _mystery_config(seed, *, model: str = "tiny", seq_len: int | None = None, micro_batch: int = 8,
                    steps: int = 10, warmup_steps: int = 2, device: str = "cpu"):
    """The :class:`~labkit.train.TrainConfig` of mystery run ``seed`` (DDP, every step after the warm-up
    profiled). It names the fault: the grader's and the tests' view, never shown to a learner."""
    from labkit.train import TrainConfig

    fault, slow_rank = _fault_of(seed)
    return TrainConfig(model=model, seq_len=seq_len, micro_batch=micro_batch, steps=steps,
                       warmup_steps=warmup_steps, profile_steps=steps - warmup_steps, parallel="ddp",
                       seed=_check_seed(seed), device=device, inject=fault.inject, inject_share=INJECT_SHARE,
                       straggler_rank=slow_rank, label="mystery")


@dataclass(frozen=True)
class MysteryRun:
    """What a learner gets back: rank 0's record (fault knobs removed from its config), the folder of
    per-rank traces and their files. Its repr names the seed only. Taught in lab 2."""

    seed: int | str
    record: RunRecord = field(repr=False)
    trace_dir: Path = field(repr=False)
    trace_files: tuple = field(repr=False)

    def __repr__(self) -> str:
        return (f"MysteryRun(seed={self.seed}, {len(self.trace_files)} trace file(s) in "
                f"{self.trace_dir.name}/, {self.record.summary()})")


def public_record(record: RunRecord, seed) -> RunRecord:
    """``record`` with the injection knobs removed from its config and ``mystery_seed`` added (in place;
    returned). Taught in lab 2."""
    if not isinstance(record, RunRecord):
        raise checks.ArgumentTypeError(f"record must be a labkit.record.RunRecord, got {type(record).__name__}")
    if not isinstance(record.config, dict):
        raise ValueError(f"record.config must be a dict (the run's TrainConfig fields), got "
                         f"{type(record.config).__name__}")
    _check_seed(seed)
    record.config = {k: v for k, v in record.config.items() if k not in _HIDDEN}
    record.config["mystery_seed"] = seed
    record.label = "mystery"
    return record


def mystery_run(seed, out_dir, *, nprocs: int = 2, timeout_s: float = 600, **sizes) -> MysteryRun:
    """Run mystery run ``seed`` on ``nprocs`` gloo ranks, its traces in ``out_dir`` (``rank{r}.json``,
    older ones removed). ``sizes``: ``model``, ``seq_len``, ``micro_batch``, ``steps``,
    ``warmup_steps``, ``device``; ``seed``: a ticket from the instructor or a practice number. Taught in lab 2."""
    from labkit.train import run

    checks.count("nprocs", nprocs, at_least=2)      # a straggler and an all-reduce need two ranks
    cfg = _mystery_config(seed, **sizes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    record = run(cfg.replace(profile_dir=str(out)), nprocs, timeout_s=timeout_s)
    files = tuple(sorted(str(p) for p in out.glob("rank*.json")))
    return MysteryRun(seed, public_record(record, seed), out, files)


# ---------------------------------------------------------------- lab 8: a starving loader of a hidden size
LOADER_LAB = "lab08_data_pipeline"
# the slow loader takes this many clean steps per batch, drawn by the seed; six at least: the clean step is timed
# before the mystery run, and beside other jobs the later step was seen 2.9x the clean one - with three clean steps
# per batch the data wait then fell to 51 %, with six it stays above half until the compute alone is 6x slower
LOADER_STEPS = (6, 7, 8)
LOADER_OPTIONS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")   # what a fix may change
_RUN_OPTIONS = ("steps", "warmup_steps", "profile_dir", "profile_steps", "label")         # how long, traced or not
_LOADER_HIDDEN = ("data_slowdown_s", "data_slowdown_s_used", "inject", "inject_share", "inject_steps")


def _loader_steps(seed) -> int:
    from labkit.teaching import tickets

    return LOADER_STEPS[tickets.draw(LOADER_LAB, seed, len(LOADER_STEPS))]


def _graded_loader(seed, key: str | None) -> int:
    """The grader's view: the clean steps per batch of ``seed``'s job; with the instructor's ``key`` only a ticket
    it issued (ValueError otherwise, :func:`labkit.teaching.tickets.verify`)."""
    from labkit.teaching import tickets

    if key is not None:
        tickets.verify(key, LOADER_LAB, seed)
    return _loader_steps(seed)


class LoaderJob:
    """Lab 8's mystery run: a short training job (``model``, ``seq_len``, ``micro_batch``) whose loader is starved —
    no workers, every sample slow by an amount ``seed`` draws and this object does not show (its repr names the
    seed; every record's config drops the slowdown and adds ``loader_seed``). Change only :data:`LOADER_OPTIONS`
    (and the run's length or trace folder: ``steps``, ``warmup_steps``, ``profile_dir``, ``profile_steps``).
    Taught in lab 8 (chapter 22)."""

    def __init__(self, seed, *, model: str = "tiny", seq_len: int | None = 64, micro_batch: int = 2,
                 steps: int = 4, warmup_steps: int = 2, device: str = "auto"):
        from labkit.teaching import tickets

        tickets.parse(seed)                     # a practice seed or a ticket; ValueError naming it otherwise
        self.seed = seed
        self.model, self.seq_len, self.device = model, seq_len, device
        self.micro_batch = checks.count("micro_batch", micro_batch, at_least=1)
        self.steps = checks.count("steps", steps, at_least=2)
        self.warmup_steps = checks.count("warmup_steps", warmup_steps, at_least=0, at_most=steps - 1)
        self._slow = None

    def __repr__(self) -> str:
        return (f"LoaderJob(seed={self.seed!r}, {self.model} GPT, micro-batch {self.micro_batch} x "
                f"{self.seq_len} tokens)")

    def _base(self):
        from labkit.teaching import tickets
        from labkit.train import TrainConfig

        return TrainConfig(model=self.model, seq_len=self.seq_len, micro_batch=self.micro_batch, steps=self.steps,
                           warmup_steps=self.warmup_steps, seed=tickets.parse(self.seed)[0], device=self.device,
                           label="mystery")

    def _config(self, **options):
        """The full config with ``options`` changed (loader and run-length options only): the hidden slowdown, sized
        on this machine's clean step (measured once) — the grader's and the tests' view."""
        bad = sorted(k for k in options if k not in LOADER_OPTIONS + _RUN_OPTIONS)
        if bad:
            raise ValueError(f"options {bad} are not the loader's: a fix of this job changes only {list(LOADER_OPTIONS)} "
                             f"(and the run's {list(_RUN_OPTIONS)})")
        if self._slow is None:
            from labkit.train import train

            clean = train(self._base().replace(steps=4, warmup_steps=2, label="clean")).step_time.median
            self._slow = round(_loader_steps(self.seed) * clean / self.micro_batch, 4)
        return self._base().replace(data_slowdown_s=self._slow).replace(**options)

    def _public(self, cfg: dict) -> dict:
        out = {k: v for k, v in cfg.items() if k not in _LOADER_HIDDEN}
        out["loader_seed"] = self.seed
        return out

    def options(self, **options) -> dict:
        """The public config of the job (with loader ``options`` changed): what its record holds. Taught in lab 8."""
        return self._public(self._config(**options).to_dict())

    def run(self, profile_dir=None, **options) -> RunRecord:
        """Train the job once (loader ``options`` changed) and return its record, the slowdown left out;
        ``profile_dir``: write its Chrome trace there (the last ``profile_steps`` steps, default every step after
        the warm-up). Taught in lab 8."""
        cfg = self._config(**options)
        if profile_dir is not None:
            Path(profile_dir).mkdir(parents=True, exist_ok=True)
            cfg = cfg.replace(profile_dir=str(profile_dir),
                              profile_steps=options.get("profile_steps", cfg.steps - cfg.warmup_steps))
        from labkit.train import train

        rec = train(cfg)
        rec.config = self._public(rec.config)
        return rec

    def ab(self, options: dict, *, rounds: int = 5, warmup: int = 0, timeout_s: float = 600,
           max_rounds: int | None = None):
        """:func:`labkit.measure.ab.ab_train` of the job as given (A) against it with loader ``options`` (B), one median step
        time per run; every run's record in the result without the slowdown. Taught in lab 8."""
        from dataclasses import replace

        from labkit.measure.ab import ab_train

        if not isinstance(options, dict) or not options:
            raise ValueError(f"options must be a non-empty dict of loader options {list(LOADER_OPTIONS)}, "
                             f"got {options!r}")
        fixed = self._config(**options).replace(label="fixed")
        res = ab_train(self._config(), fixed, rounds=rounds, warmup=warmup, timeout_s=timeout_s,
                       max_rounds=max_rounds)
        runs = tuple({**r, "config": self._public(r["config"])} for r in res.runs)
        return replace(res, runs=runs)
