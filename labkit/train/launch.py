"""The reference loop on N fresh ranks: ``run(cfg, nprocs)`` through :func:`labkit.launch`.

The ranks run :func:`labkit.train.loop.train` with torch.distributed initialised by the launcher; the
same entry runs under plain ``torchrun --nproc_per_node=N -m labkit run`` (multi-node, Slurm), so code
that outgrows one machine keeps working. :func:`run_many` trains several configs one after the other
in the same ranks (starting processes is the slow part on a loaded machine).

Taught in chapter 4 (MFU), chapter 14 (baseline record), chapter 19/20 (DDP/FSDP).
"""
from __future__ import annotations

from labkit import checks
from labkit.record import RunRecord
from labkit.train import report
from labkit.train.config import TrainConfig
from labkit.train.loop import train


def _rank_entry(cfg: TrainConfig, probe=None) -> RunRecord:
    """What each launched rank runs for :func:`run` (importable, so labkit.launch can start it)."""
    return train(cfg, probe=probe)


def _rank_many(cfgs: list, probe=None) -> list:
    """What each launched rank runs for :func:`run_many`."""
    return [train(c, probe=probe) for c in cfgs]


def _check(cfgs, nprocs) -> None:
    for cfg in cfgs:
        if not isinstance(cfg, TrainConfig):
            raise TypeError(f"run needs a TrainConfig, got {type(cfg).__name__}")
        check_world(cfg, nprocs)


def check_world(cfg: TrainConfig, nprocs: int) -> None:
    """Every option of ``cfg`` that names a rank or a group size, against a world of ``nprocs`` ranks, before
    any rank starts (``run``, ``run_many`` and ``labkit run`` under torchrun): ``parallel="single"`` on one
    replica, tp · pp · cp dividing the world, ``ep`` dividing the data-parallel ranks, ``fail_rank`` and
    ``straggler_rank`` ranks of the world, ``ranks_per_node`` whole "nodes". Taught in chapter 19 (DDP),
    chapter 24 (the mesh), chapter 26 (ep), chapter 27 (faults) and chapter 29 (the slow link)."""
    nprocs = checks.count("nprocs", nprocs)
    if cfg.parallel == "single" and nprocs != cfg.tp * cfg.pp:
        raise ValueError(f"nprocs={nprocs} with parallel='single': use parallel='ddp' or 'fsdp' for > 1 rank"
                         + (f" (or nprocs = tp·pp = {cfg.tp * cfg.pp})" if cfg.tp * cfg.pp > 1 else ""))
    if cfg.tp * cfg.pp * cfg.cp > 1:
        from labkit.train.parallel import mesh_shape

        mesh_shape(cfg, nprocs)     # tp · pp · dp = nprocs, with a clear error
    raf = cfg.reshard_after_forward        # FSDP2 int reshard: a group size dividing the ranks (chapter 20)
    if cfg.parallel == "fsdp" and not isinstance(raf, bool) and isinstance(raf, int) and nprocs % raf:
        raise ValueError(f"TrainConfig.reshard_after_forward={raf} is not valid on {nprocs} ranks: an int must "
                         "divide the ranks, or use True / False / None")
    dp = nprocs // (cfg.tp * cfg.pp * cfg.cp)
    if cfg.ep > 1 and dp % cfg.ep:
        raise ValueError(f"TrainConfig.ep={cfg.ep} must divide the {dp} data-parallel ranks of {nprocs} (expert "
                         f"parallelism shares them): use a world size that is a multiple of {cfg.ep}")
    for name in ("fail_rank", "straggler_rank"):
        r = getattr(cfg, name)
        if r is not None and r >= nprocs:
            raise ValueError(f"TrainConfig.{name}={r} is not a rank of this run: use 0..{nprocs - 1}")
    if cfg.ranks_per_node is not None:
        from labkit.train.slow_link import check_layout

        if cfg.ranks_per_node > nprocs:
            raise ValueError(f"TrainConfig.ranks_per_node={cfg.ranks_per_node} is more than the {nprocs} ranks: "
                             "a 'node' holds at most the world")
        check_layout(cfg, nprocs)


def run(cfg: TrainConfig, nprocs: int = 1, *, timeout_s: float = 600, stream: bool = False,
        probe=None, flight_recorder=None) -> RunRecord:
    """Train ``cfg`` on ``nprocs`` fresh ranks; rank 0's record (:func:`labkit.train.report.combine`).

    ``record.extra["losses_per_rank"]`` holds every rank's loss curve (identical after the all-reduce),
    ``extra["rank_peak_rss_bytes"]`` every rank's peak RSS. ``parallel="single"`` needs ``nprocs=1``.
    ``probe``: a module-level function run in every rank at the end (:func:`labkit.train.loop.train`).
    ``flight_recorder``: a folder for every rank's Flight Recorder dump (``launch(flight_recorder=...)``;
    read with ``labkit diagnose --hang``, chapter 27).
    Taught in chapter 4 (MFU), chapter 14 (baseline record), chapter 19/20 (DDP/FSDP).
    """
    _check([cfg], nprocs)
    from labkit.launcher.parent import launch

    res = launch(_rank_entry, nprocs, args=(cfg, probe), timeout_s=timeout_s, stream=stream, rank0_only=True,
                 flight_recorder=flight_recorder)
    return report.combine(res)


def run_many(cfgs, nprocs: int = 1, *, timeout_s: float = 600, all_ranks: bool = False, probe=None) -> list:
    """Train each config in turn in the same ``nprocs`` ranks; one record per config (rank 0's), or with
    ``all_ranks`` a list of every rank's record per config. Taught in chapter 14."""
    cfgs = list(cfgs)
    if not cfgs:
        raise ValueError("run_many needs at least one TrainConfig")
    _check(cfgs, nprocs)
    from labkit.launcher.parent import launch

    res = launch(_rank_many, nprocs, args=(cfgs, probe), timeout_s=timeout_s, stream=False)
    if all_ranks:
        return [[per_rank[i] for per_rank in res.values] for i in range(len(cfgs))]
    out = []
    for i, rec in enumerate(res.value):
        rec.extra["losses_per_rank"] = [per_rank[i].loss for per_rank in res.values]
        rec.extra["trace_files"] = [f for per_rank in res.values for f in per_rank[i].extra.get("trace_files", [])]
        out.append(rec)
    return out
