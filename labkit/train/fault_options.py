"""TrainConfig's fault-tolerance options checked (chapter 27): kept apart from
:mod:`labkit.train.checkpoint` so the config imports nothing that imports the config."""
from __future__ import annotations

MODES = ("sync", "async")


def validate(cfg, bad) -> None:
    """TrainConfig's checks of the fault-tolerance knobs (called from ``__post_init__``; ``bad(name, valid)``
    raises a ValueError naming the field). Taught in chapter 27."""
    from labkit import checks

    checks.count("TrainConfig.checkpoint_every", cfg.checkpoint_every, at_least=0)
    if cfg.checkpoint_mode not in MODES:
        bad("checkpoint_mode", f"choose one of {MODES}")
    if cfg.checkpoint_dir is not None and not (isinstance(cfg.checkpoint_dir, str) and cfg.checkpoint_dir):
        bad("checkpoint_dir", "give a directory path (str) or None")
    used = cfg.checkpoint_every or cfg.resume_from is not None or cfg.fail_at_step is not None
    if not used:
        if cfg.checkpoint_dir is not None or cfg.checkpoint_mode != "sync" or cfg.fail_rank:
            bad("checkpoint_dir" if cfg.checkpoint_dir is not None else
                "checkpoint_mode" if cfg.checkpoint_mode != "sync" else "fail_rank",
                "it applies with checkpoint_every ≥ 1, resume_from or fail_at_step only")
        return
    if cfg.resume_from is not None and not (isinstance(cfg.resume_from, str) and cfg.resume_from):
        bad("resume_from", "give a checkpoint directory (str), 'latest' (with checkpoint_dir) or None")
    if cfg.checkpoint_dir is None and (cfg.checkpoint_every or cfg.resume_from == "latest"
                                       or cfg.fail_at_step is not None):
        bad("checkpoint_dir", "checkpoint_every, resume_from='latest' and fail_at_step need a checkpoint_dir")
    if cfg.fail_at_step is not None:
        checks.count("TrainConfig.fail_at_step", cfg.fail_at_step, at_least=0, at_most=cfg.steps - 1)
    checks.count("TrainConfig.fail_rank", cfg.fail_rank, at_least=0)
    for name, used_here in (("tp", cfg.tp * cfg.pp > 1), ("accum", cfg.adaptive), ("inject", cfg.inject != "none"),
                            ("parallel", cfg.parallel == "fsdp1")):
        if used_here:
            bad(name, "checkpoints, resume and fault injection run with tp = pp = 1, a fixed accum, inject='none' "
                "and parallel 'single', 'ddp' or 'fsdp' in labkit")
