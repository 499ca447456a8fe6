"""The live runs :mod:`labkit.perf.validate` calibrates from and checks against (issue #15).

Each helper launches fresh gloo ranks (:func:`labkit.launcher.launch`) and trains :class:`labkit.train.TrainConfig`
runs in them. On a shared machine the speed drifts over seconds (a neighbour's load, frequency, the kernel's
4 ms tick): one short run of a configuration can land in a slow moment that the next configuration escapes.
So a launch runs its configurations **interleaved** — A B C, A B C, … ``repeats`` times — and each
configuration's result is its **median run** (the run whose median step is the median over the repeats;
for an even count the lower middle one): a slow episode hits every configuration alike and one unlucky run
is outvoted. ``record.extra["run_medians_s"]`` keeps every repeat's median step, in order, so that
differences between two configurations can be taken run by run (paired), as :mod:`labkit.perf.validate`
does for the wrapper's own cost.

Layer 3 (ARCHITECTURE.md): it launches ranks and measures. Taught in chapter 7 (timing on a noisy machine:
interleave and take medians), chapter 5 (scaling) and chapter 24 (how far to trust a model).
"""
from __future__ import annotations

from labkit import checks

__all__ = ["compute_rate", "pace", "measure_steps", "measure_concurrent_rates", "measure_steps_then_rates",
           "measure_compute_rate", "median_run", "run_medians"]


def compute_rate(record) -> float:
    """Achieved hardware FLOP/s per rank of a run: tokens per step × hardware FLOPs per token / median
    step / ranks — from a 1-rank run it is this machine's calibrated compute rate for that model.

    ``record``: a :class:`labkit.record.RunRecord` (or anything with its ``step_time``,
    ``tokens_per_step``, ``hardware_flops_per_token`` and ``n_devices``). Taught in chapter 5 and chapter 4.
    """
    missing = [k for k in ("step_time", "tokens_per_step", "hardware_flops_per_token", "n_devices")
               if getattr(record, k, None) is None]
    if missing:
        raise checks.ArgumentTypeError(f"record must be a labkit RunRecord with a measured step, got "
                                       f"{type(record).__name__} {record!r:.60} (no {', '.join(missing)})")
    step = checks.positive("record.step_time.median", record.step_time.median)
    tokens = checks.count("record.tokens_per_step", record.tokens_per_step)
    fpt = checks.positive("record.hardware_flops_per_token", record.hardware_flops_per_token)
    n = checks.count("record.n_devices", record.n_devices)
    return checks.finite_result("FLOP/s per rank", tokens * fpt / step / n, step=step, tokens=tokens)


def median_run(records: list):
    """The record whose median step is the median of ``records``' (the lower middle one of an even count),
    with ``extra["run_medians_s"]`` = every record's median step in the order given. Taught in chapter 7."""
    recs = list(records)
    if not recs:
        raise ValueError("median_run needs at least one record, got none")
    meds = [checks.positive("record.step_time.median", r.step_time.median) for r in recs]
    pick = recs[sorted(range(len(recs)), key=meds.__getitem__)[(len(recs) - 1) // 2]]
    if isinstance(getattr(pick, "extra", None), dict):
        pick.extra["run_medians_s"] = meds
    return pick


def run_medians(record) -> list:
    """The median step of each interleaved repeat behind ``record`` (:func:`median_run`), or its own median
    alone for a record of one run. Taught in chapter 7."""
    extra = getattr(record, "extra", None)
    if isinstance(extra, dict) and extra.get("run_medians_s"):
        return list(extra["run_medians_s"])
    return [record.step_time.median]


def _replicated_single(cfg) -> bool:
    """A plain config that would train one whole model per rank (parallel 'single', tp = pp = 1)."""
    return getattr(cfg, "parallel", None) == "single" and getattr(cfg, "tp", 1) * getattr(cfg, "pp", 1) == 1


def _rank_cells(cfgs: list, repeats: int = 1) -> list:
    """What each launched rank runs: every config in turn, ``repeats`` times (starting ranks is the slow
    part); per config its :func:`median_run`."""
    from labkit.train import train

    runs = [[train(c) for c in cfgs] for _ in range(repeats)]
    return [median_run([r[i] for r in runs]) for i in range(len(cfgs))]


def measure_steps(cfgs, nranks: int, *, repeats: int = 1, threads_per_rank: int = 1, timeout_s: float = 600) -> list:
    """Train each of ``cfgs`` in turn, ``repeats`` times interleaved, in the same ``nranks`` fresh ranks
    (``OMP_NUM_THREADS`` = ``threads_per_rank``); rank 0's :func:`median_run` record per config.
    Taught in chapter 5 (scaling), chapter 19 (DDP) and chapter 20 (FSDP)."""
    cfgs = list(cfgs)
    if not cfgs:
        raise ValueError("measure_steps needs at least one TrainConfig, got none")
    n = checks.count("nranks", nranks)
    t = checks.count("threads_per_rank", threads_per_rank)
    k = checks.count("repeats", repeats)
    for c in cfgs:
        if _replicated_single(c) and n != 1:
            raise ValueError(f"nranks={n} with parallel='single' and tp = pp = 1 ({c.label}): use 'ddp' or 'fsdp' "
                             "(or tp/pp > 1) for > 1 rank")
    from labkit.launcher.parent import launch

    res = launch(_rank_cells, n, args=(cfgs, k), env={"OMP_NUM_THREADS": str(t)}, timeout_s=timeout_s,
                 stream=False)
    return list(res.value)


def _independent_cells(cfgs: list, repeats: int, flags: str, world: tuple | None = None) -> list:
    """What each rank runs for a concurrent-rate calibration: leave the process group (no communication at
    all), train each config alone, ``repeats`` times interleaved, then say so with a file in ``flags`` and keep
    training short filler runs until every rank has said so — so every rank measures every step with all
    ranks computing. This rank's rate per config: the median over the repeats. ``world``: (rank, ranks) when
    no process group says so (tests)."""
    import statistics
    from pathlib import Path

    import torch.distributed as dist

    from labkit.train import train

    rank, n = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (world or (0, 1))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    runs = [[train(c) for c in cfgs] for _ in range(repeats)]
    (Path(flags) / f"done.{rank}").touch()
    filler = cfgs[0].replace(steps=2, warmup_steps=0, label="filler")
    while len(list(Path(flags).glob("done.*"))) < n:
        train(filler)
    return [statistics.median(compute_rate(r[i]) for r in runs) for i in range(len(cfgs))]


def _launch_independent(target, n: int, args: tuple, threads: int, timeout_s: float):
    """Launch ``target(*args, flags)`` on ``n`` ranks with a fresh folder for :func:`_independent_cells`' flags
    (removed afterwards, whatever happens); every rank's return value."""
    import shutil
    import tempfile

    from labkit.launcher.parent import launch

    flags = tempfile.mkdtemp(prefix="labkit-rates-")
    try:
        return launch(target, n, args=(*args, flags), env={"OMP_NUM_THREADS": str(threads)}, timeout_s=timeout_s,
                      stream=False).values
    finally:
        shutil.rmtree(flags, ignore_errors=True)


def pace(per_rank: list, cores: int) -> list:
    """Per config, the rate a synchronous step of these ranks keeps, from each rank's independent rate
    (``per_rank[rank][config]``): the slowest rank's while every rank has a core of its own (ranks ≤
    ``cores``: the others wait for it, and their cores idle); with more ranks than cores a waiting rank
    gives its core to the others, so the step goes at the ranks' harmonic-mean rate (the same total work on
    the same total cores). Taught in chapter 9 (stragglers) and chapter 24."""
    n, c = len(per_rank), checks.count("cores", cores)
    if n == 0 or any(len(r) != len(per_rank[0]) for r in per_rank):
        raise ValueError(f"per_rank must hold one equal-length list of rates per rank, got {per_rank!r:.80}")
    cols = [[checks.positive("rate", r[i]) for r in per_rank] for i in range(len(per_rank[0]))]
    return [min(col) if n <= c else n / sum(1 / x for x in col) for col in cols]


def measure_concurrent_rates(cfgs, nranks: int, *, repeats: int = 1, threads_per_rank: int = 1,
                             timeout_s: float = 600) -> list:
    """Achieved hardware FLOP/s per rank for each of ``cfgs`` (``parallel="single"``) while ``nranks``
    ranks train it at once, independently and without communication — the compute rate at this
    concurrency: each rank's median over ``repeats`` interleaved runs (:func:`compute_rate`), combined by
    :func:`pace` into the rate a synchronous step keeps (the slowest rank's while each rank has its own core:
    on this VM one of two ranks often computes 10–20 % slower than the other). Taught in chapter 5,
    chapter 9 (stragglers) and chapter 24."""
    cfgs = list(cfgs)
    if not cfgs or any(getattr(c, "parallel", None) != "single" for c in cfgs):
        raise ValueError("measure_concurrent_rates needs TrainConfigs with parallel='single', got "
                         f"{[getattr(c, 'parallel', c) for c in cfgs]}")
    n = checks.count("nranks", nranks)
    t = checks.count("threads_per_rank", threads_per_rank)
    k = checks.count("repeats", repeats)
    from labkit.launcher.parent import cores_available

    return pace(_launch_independent(_independent_cells, n, (cfgs, k), t, timeout_s), cores_available())


def _steps_then_independent(cfgs: list, plain: list, repeats: int, flags: str) -> tuple:
    """What each rank runs for :func:`measure_steps_then_rates`: ``cfgs`` with the process group
    (:func:`_rank_cells`), then — in the same processes — ``plain`` independently (:func:`_independent_cells`)."""
    return _rank_cells(cfgs, repeats), _independent_cells(plain, repeats, flags)


def measure_steps_then_rates(cfgs, plain, nranks: int, *, repeats: int = 1, threads_per_rank: int = 1,
                             timeout_s: float = 900) -> tuple[list, list]:
    """(rank 0's :func:`median_run` record per config of ``cfgs``, the concurrent rate per config of
    ``plain``) from ONE launch of ``nranks`` ranks: first ``cfgs`` (data-parallel, interleaved ``repeats``
    times), then the same processes leave the process group and train ``plain`` (``parallel="single"``)
    independently, as :func:`measure_concurrent_rates` (their :func:`pace`). A process's speed on a
    shared VM differs from the next process's by several per cent (where its memory and threads land);
    measured here, a rate and the steps it predicts share it. Taught in chapter 24 (calibrate where you measure)."""
    cfgs, plain = list(cfgs), list(plain)
    if not cfgs or not plain or any(getattr(c, "parallel", None) != "single" for c in plain):
        raise ValueError("measure_steps_then_rates needs TrainConfigs to measure and plain (parallel='single') ones "
                         f"to rate, got {[getattr(c, 'parallel', c) for c in cfgs]} and "
                         f"{[getattr(c, 'parallel', c) for c in plain]}")
    n = checks.count("nranks", nranks, at_least=2)
    t = checks.count("threads_per_rank", threads_per_rank)
    k = checks.count("repeats", repeats)
    if any(_replicated_single(c) for c in cfgs):
        raise ValueError(f"nranks={n} with parallel='single' and tp = pp = 1 in cfgs: use 'ddp' or 'fsdp' (or "
                         "tp/pp > 1) for > 1 rank")
    from labkit.launcher.parent import cores_available

    values = _launch_independent(_steps_then_independent, n, (cfgs, plain, k), t, timeout_s)
    return list(values[0][0]), pace([v[1] for v in values], cores_available())


def measure_compute_rate(cfg, *, threads_per_rank: int = 1, timeout_s: float = 600) -> tuple[float, object]:
    """(achieved hardware FLOP/s per rank, the record) of ``cfg`` trained alone on 1 rank with
    ``threads_per_rank`` threads — the compute input of :func:`labkit.perf.validate.predict_step`.
    Taught in chapter 5."""
    rec = measure_steps([cfg.replace(parallel="single", label=f"{cfg.label} 1-rank rate")], 1,
                        threads_per_rank=threads_per_rank, timeout_s=timeout_s)[0]
    return compute_rate(rec), rec
