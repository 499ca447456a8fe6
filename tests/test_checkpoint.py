"""Chapter 27: periodic DCP checkpoints (sync and async) in the one loop, resume, and their record —
on real gloo ranks."""
import os

import pytest
import torch

from labkit.train import TrainConfig, run_many, train
from labkit.train.checkpoint import complete, latest, load_snapshot, saved_step, snapshot, step_dir

os.environ.setdefault("OMP_NUM_THREADS", "1")
BASE = TrainConfig(steps=4, warmup_steps=1, micro_batch=4, peak_flops=1e12, device="cpu", parallel="ddp")


def _equal(a: dict, b: dict) -> list:
    """The keys whose tensors differ (or exist on one side only)."""
    bad = sorted(set(a) ^ set(b))
    return bad + [k for k in sorted(set(a) & set(b)) if not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("change, name", [
    ({"checkpoint_every": 2}, "checkpoint_dir"),
    ({"checkpoint_every": -1}, "checkpoint_every"),
    ({"checkpoint_every": 2, "checkpoint_dir": "d", "checkpoint_mode": "later"}, "checkpoint_mode"),
    ({"checkpoint_dir": "d"}, "checkpoint_dir"),
    ({"resume_from": "latest"}, "checkpoint_dir"),
    ({"fail_at_step": 9, "checkpoint_dir": "d"}, "fail_at_step"),
    ({"checkpoint_every": 1, "checkpoint_dir": "d", "inject": "host"}, "inject"),
    ({"checkpoint_every": 1, "checkpoint_dir": "d", "accum": "adaptive"}, "accum"),
])
def test_bad_checkpoint_options_are_named(change, name):
    with pytest.raises((ValueError, TypeError), match=name):
        BASE.replace(**change)


def test_latest_skips_incomplete_checkpoints(tmp_path):
    """A checkpoint without .metadata (a write cut off by a failure) is never resumed from."""
    assert latest(tmp_path / "none") is None
    for s in (2, 4, 6):
        step_dir(tmp_path, s).mkdir()
    (step_dir(tmp_path, 2) / ".metadata").write_bytes(b"x")
    (step_dir(tmp_path, 4) / ".metadata").write_bytes(b"x")
    assert latest(tmp_path) == step_dir(tmp_path, 4) and not complete(step_dir(tmp_path, 6))
    assert saved_step(latest(tmp_path)) == 4
    with pytest.raises(ValueError, match="not a labkit checkpoint"):
        saved_step(tmp_path)


def test_resume_in_one_process_follows_the_uninterrupted_curve(tmp_path):
    """Resume restores model, optimizer and step, and the loader is fast-forwarded: same losses."""
    cfg = BASE.replace(parallel="single", steps=4)
    full = train(cfg.replace(checkpoint_every=2, checkpoint_dir=str(tmp_path)))
    rec = train(cfg.replace(steps=5, resume_from="latest", checkpoint_dir=str(tmp_path)))   # latest = step 4
    assert rec.extra["checkpoint"]["resumed_from"]["step"] == 4 and len(rec.loss) == 1
    half = train(cfg.replace(resume_from=str(step_dir(tmp_path, 2))))
    assert half.extra["checkpoint"]["steps_run"] == 2
    assert half.loss == pytest.approx(full.loss[2:], rel=1e-6)


@pytest.mark.slow
def test_sync_and_async_saves_on_two_gloo_ranks_restore_exactly(tmp_path):
    """2 gloo ranks (DDP): a sync run, an async run and a run resumed from the sync run's step 2, in the
    same ranks. Each saved step-4 checkpoint, loaded into a fresh model + AdamW, equals the ranks' last
    state tensor for tensor; the resumed run ends in the same state and losses as the uninterrupted one;
    every async write completed (its future ran, .metadata exists) and its stall was recorded."""
    s_dir, a_dir = tmp_path / "sync", tmp_path / "async"
    cfgs = [BASE.replace(checkpoint_every=2, checkpoint_dir=str(s_dir)),
            BASE.replace(checkpoint_every=2, checkpoint_dir=str(a_dir), checkpoint_mode="async"),
            BASE.replace(resume_from=str(step_dir(s_dir, 2)))]
    sync, asy, resumed = run_many(cfgs, 2, timeout_s=240, probe=snapshot)
    for rec, root in ((sync, s_dir), (asy, a_dir)):
        ck = rec.extra["checkpoint"]
        assert [r["step"] for r in ck["saves"]] == [2, 4] and ck["state_bytes"] > 0
        assert all(r["stall_s"] > 0 for r in ck["saves"]) and latest(root) == step_dir(root, 4)
        loaded = load_snapshot(step_dir(root, 4), BASE)
        assert loaded.pop("step") == 4
        assert not _equal(loaded, rec.extra["probe"]), root
        assert any(k.startswith("optim.state.") and k.endswith("exp_avg_sq") for k in loaded)   # Adam's state too
    earlier = load_snapshot(step_dir(s_dir, 2), BASE)
    assert earlier.pop("step") == 2 and _equal(earlier, sync.extra["probe"])    # the comparison can fail
    assert all("written_s" in r for r in asy.extra["checkpoint"]["saves"])     # each future completed
    assert asy.loss == pytest.approx(sync.loss, rel=1e-6)                      # saving does not change training
    assert resumed.extra["checkpoint"]["resumed_from"]["step"] == 2
    assert resumed.loss == pytest.approx(sync.loss[2:], rel=1e-6)
    assert not _equal(resumed.extra["probe"], sync.extra["probe"])
