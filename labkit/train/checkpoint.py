"""Periodic training checkpoints, resume, and an injected rank failure — the loop's fault tolerance.

``TrainConfig(checkpoint_every=N, checkpoint_dir=D)`` saves model + optimizer + step every N optimizer
steps with ``torch.distributed.checkpoint`` (DCP: every rank writes its own shards, rank 0 writes
``.metadata`` last, so a checkpoint without ``.metadata`` is incomplete and never resumed from):

- ``checkpoint_mode="sync"``: ``dcp.save`` — the loop waits for the whole write (serialise + disk);
- ``checkpoint_mode="async"``: ``dcp.async_save`` — the loop waits only while the state is copied
  (staged) to host memory, then a background thread writes it; the previous save must finish before
  the next starts (its remaining wait counts as stall). Its collectives run on a separate gloo group so
  they never interleave with the training collectives.

The *stall* of a save is the time the training loop is blocked by it (``time.perf_counter`` around the
call, plus any wait for the previous async save), measured on every rank and recorded per save in
``record.extra["checkpoint"]`` with the state's bytes and when each async write completed.

``resume_from`` = a checkpoint directory, or ``"latest"`` (the newest complete ``step_*`` under
``checkpoint_dir``; nothing there → a fresh start) restores model, optimizer and step; the data loader
is fast-forwarded over the steps already trained, so a resumed run sees the same batches as an
uninterrupted one. ``fail_at_step=k`` with ``fail_rank=r`` makes rank r ``os._exit(13)`` at the start
of step k once (a marker file in ``checkpoint_dir`` stops it failing again after a restart): under
``torchrun --max-restarts=1`` the job restarts, resumes from the last checkpoint, and the record counts
the steps lost (steps completed before the failure, per rank 0's progress file, minus the resumed step).

Taught in chapter 27 (multi-node, elastic and fault-tolerant training).
"""
from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

from labkit.train.fault_options import MODES, validate  # noqa: F401  (re-exported)


def step_dir(root, step: int) -> Path:
    """The directory of the checkpoint taken after ``step`` optimizer steps. Taught in chapter 27."""
    return Path(root) / f"step_{int(step):07d}"


def complete(path) -> bool:
    """Whether ``path`` is a finished DCP checkpoint (its ``.metadata`` is written last). Chapter 27."""
    return (Path(path) / ".metadata").is_file()


def latest(root) -> Path | None:
    """The newest complete checkpoint under ``root`` (None if none). Taught in chapter 27."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and complete(p))
    return done[-1] if done else None


def saved_step(path) -> int:
    """The optimizer step a checkpoint directory was taken after (from its name). Chapter 27."""
    name = Path(path).name
    if not name.startswith("step_") or not name[5:].isdigit():
        raise ValueError(f"{path!s} is not a labkit checkpoint directory (expected a name like step_0000010)")
    return int(name[5:])


def state_bytes(state) -> int:
    """Bytes of every tensor in a (nested) state dict — what one save writes per rank. Chapter 27."""
    import torch

    if isinstance(state, torch.Tensor):
        local = getattr(state, "_local_tensor", state)        # a DTensor: this rank's shard
        return int(local.numel() * local.element_size())
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def snapshot(model, optimizer, cfg=None) -> dict:
    """Every tensor of model + optimizer state as full, detached CPU copies, keyed ``model.<name>`` and
    ``optim.<path>`` — the same view DCP saves (a :func:`labkit.train.train` ``probe``: compare a saved
    run's last state with a restored one, tensor by tensor). Taught in chapter 27."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    out: dict = {}

    def walk(prefix, v):
        if hasattr(v, "detach"):
            out[prefix] = v.detach().cpu().clone()
        elif isinstance(v, dict):
            for k, w in v.items():
                walk(f"{prefix}.{k}", w)
        elif isinstance(v, (list, tuple)):
            for k, w in enumerate(v):
                walk(f"{prefix}.{k}", w)

    walk("model", msd)
    walk("optim", osd)
    return out


def load_snapshot(path, cfg) -> dict:
    """Load the checkpoint at ``path`` into a fresh model and AdamW of ``cfg`` in this process (no ranks
    needed: DCP reshards on load) and return its :func:`snapshot` plus ``"step"``. Taught in chapter 27."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from labkit.model.gpt import GPT
    from labkit.train.optim import build_optimizer

    if not complete(path):
        raise ValueError(f"{path!s} is not a complete checkpoint (no .metadata)")
    torch.manual_seed(cfg.seed + 1)              # different initial weights: equality must come from the load
    model = GPT(cfg.model_config)
    opt = build_optimizer(model, cfg.replace(parallel="single"))
    for p in model.parameters():                 # one step creates AdamW's state tensors to load into
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
    with warnings.catch_warnings():          # DCP warns that it loads "in a single process": that is the point
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    out = snapshot(model, opt)
    out["step"] = int(state["step"])
    return out


class Checkpointer:
    """Saves, resumes and fails on schedule for one rank of :func:`labkit.train.loop.train`.

    Build it after the model and optimizer, on every rank (it creates the async group collectively).
    Taught in chapter 27.
    """

    def __init__(self, cfg, model, optimizer, rank: int = 0, world_size: int = 1):
        import torch.distributed as dist

        self.cfg, self.model, self.opt, self.rank = cfg, model, optimizer, rank
        self.root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        self.dist = dist.is_initialized()
        # async writes gather plans on their own thread: a separate group keeps them off the training one
        self.group = dist.new_group(backend="gloo") if self.dist and cfg.checkpoint_mode == "async" else None
        self.saves: list = []
        self.pending = None
        self.resumed_from = None
        self.steps_lost = None
        self.bytes = None

    # -- state -------------------------------------------------------------------------------------
    def _state(self, step: int) -> dict:
        import torch
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd, "step": torch.tensor(step)}

    def _kw(self) -> dict:
        return {"no_dist": not self.dist, "process_group": self.group}

    # -- resume ------------------------------------------------------------------------------------
    def resume(self) -> int:
        """Load ``cfg.resume_from`` (a path or "latest") into model and optimizer; the step to start at."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        src = self.cfg.resume_from
        if src is None:
            return 0
        path = latest(self.root) if src == "latest" else Path(src)
        if path is None:
            return 0                                # "latest" with nothing saved yet: a fresh start
        if not complete(path):
            raise ValueError(f"TrainConfig.resume_from={src!r}: {path} is not a complete checkpoint (no .metadata)")
        state = self._state(0)
        dcp.load(state, checkpoint_id=str(path), **self._kw())
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(state["step"])
        self.resumed_from = {"path": str(path), "step": step}
        reached = [json.loads(f.read_text()).get("step", 0) for f in self.root.glob("failed_rank*.json")] \
            if self.root is not None else []           # an injected failure: the steps its rank had completed
        progress = self.root / "progress.json" if self.root is not None else None
        if progress is not None and progress.is_file():
            reached.append(json.loads(progress.read_text())["completed"])
        if reached:
            self.steps_lost = max(0, max(int(r) for r in reached) - step)
        return step

    # -- per step ----------------------------------------------------------------------------------
    def before_step(self, i: int) -> None:
        """The injected failure: rank ``fail_rank`` exits at the start of step ``fail_at_step``, once."""
        cfg = self.cfg
        if cfg.fail_at_step is None or i != cfg.fail_at_step or self.rank != cfg.fail_rank:
            return
        marker = self.root / f"failed_rank{self.rank}.json"
        if marker.exists():
            return
        marker.write_text(json.dumps({"step": i, "pid": os.getpid(), "time": time.time()}))
        os._exit(13)                               # as a killed process: no cleanup, no barrier, no flush

    def after_step(self, i: int) -> float:
        """Progress file (rank 0) and, every ``checkpoint_every`` steps, a save; the seconds blocked."""
        if self.root is not None and self.rank == 0:
            tmp = self.root / "progress.json.tmp"
            tmp.write_text(json.dumps({"completed": i + 1}))
            tmp.replace(self.root / "progress.json")
        every = self.cfg.checkpoint_every
        if not every or (i + 1) % every:
            return 0.0
        return self.save(i + 1)

    def save(self, step: int) -> float:
        """Save the state after ``step`` steps in the configured mode; returns the stall (s)."""
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        waited = 0.0
        if self.pending is not None:                 # DCP: one async save at a time
            self.pending.result()
            waited = time.perf_counter() - t0
            self.pending = None
        state = self._state(step)
        if self.bytes is None:
            self.bytes = state_bytes(state)
        path = str(step_dir(self.root, step))
        row = {"step": step, "path": path, "mode": self.cfg.checkpoint_mode}
        if self.cfg.checkpoint_mode == "sync":
            dcp.save(state, checkpoint_id=path, **self._kw())
        else:
            fut = dcp.async_save(state, checkpoint_id=path, **self._kw())
            fut = getattr(fut, "upload_completion", fut)      # AsyncSaveResponse (process-based) → its future
            start = t0 + waited
            fut.add_done_callback(lambda f, r=row, s=start: r.update(written_s=time.perf_counter() - s))
            self.pending = fut
        row["stall_s"] = time.perf_counter() - t0
        row["waited_previous_s"] = waited
        self.saves.append(row)
        return row["stall_s"]

    def finish(self) -> float:
        """Wait for an outstanding async save (at the end of the run); the seconds waited."""
        if self.pending is None:
            return 0.0
        t0 = time.perf_counter()
        self.pending.result()
        self.pending = None
        return time.perf_counter() - t0

    def extra(self, steps_run: int, final_wait_s: float) -> dict:
        """The record's ``extra["checkpoint"]``."""
        import statistics

        stalls = [r["stall_s"] for r in self.saves]
        return {"mode": self.cfg.checkpoint_mode, "every": self.cfg.checkpoint_every, "dir": str(self.root),
                "saves": self.saves, "n_saves": len(self.saves), "state_bytes": self.bytes,
                "stall_s_median": statistics.median(stalls) if stalls else None,
                "stall_s_total": sum(stalls), "final_wait_s": final_wait_s,
                "resumed_from": self.resumed_from, "steps_lost": self.steps_lost, "steps_run": steps_run,
                "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
