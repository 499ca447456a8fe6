"""What does labkit.integrations.hf.ThroughputCallback cost a transformers Trainer? (goal: ratio <= 1.01)

The same tiny GPT-2 (built offline from a config) trained by a CPU ``Trainer`` with and without the
callback, ``--rounds`` rounds of each, interleaved (order alternating) so both see the same machine
load. A small timing callback, first in both arms, takes the time from the first ``on_step_begin`` to
the last ``on_step_end`` (training steps only: the Trainer's set-up and the callback's one-off peak
look-up at ``on_train_begin`` are outside). Prints the median with/without ratio and the per-step
overhead; the callback logs every ``--log-every`` steps, so its log-time work is inside the window.
Needs ``transformers`` and ``accelerate`` (labkit[dev]).

    .venv/bin/python benchmarks/bench_callback.py [--steps 30] [--rounds 5]

Taught in chapter 7 (timing).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import transformers
import transformers.trainer as hf_trainer

from labkit.integrations.hf import ThroughputCallback

# the repository's datasets/ folder is importable from its root and would pass for Hugging Face `datasets`
hf_trainer.is_datasets_available = lambda: False


class StepWindow(transformers.TrainerCallback):
    """Seconds from the first on_step_begin to the last on_step_end."""

    def __init__(self):
        self.first = self.last = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first is None:
            self.first = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.last = time.perf_counter()


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n, seq):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 256, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def one_run(with_callback: bool, steps: int, batch: int, seq: int, log_every: int, out: str) -> float:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=batch,
                                          logging_steps=log_every, report_to=[], use_cpu=True,
                                          save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    window = StepWindow()
    cbs = [window] + ([ThroughputCallback(peak=1e12)] if with_callback else [])
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Synthetic(steps * batch, seq), callbacks=cbs)
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)     # no log dicts on stdout
    trainer.train()
    return (window.last - window.first) / (steps - 1)


def micro(steps: int, batch: int, seq: int) -> float:
    """Seconds per step of the callback's own work: its hooks in the Trainer's order and its token count
    of one batch, around no training at all (a log line every 10 steps)."""
    from types import SimpleNamespace

    cb = ThroughputCallback(peak=1e12, warmup_steps=0)
    args = SimpleNamespace(bf16=False, fp16=False, device=torch.device("cpu"), world_size=1)
    state = SimpleNamespace(log_history=[], global_step=0)
    module = torch.nn.Linear(1, 1)
    cb.on_train_begin(args, state, None, model=None)
    kwargs = {"input_ids": torch.zeros(batch, seq, dtype=torch.long),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long)}
    t0 = time.perf_counter()
    for i in range(steps):
        cb.on_step_begin(args, state, None)
        cb._count(module, (), kwargs)
        cb.on_pre_optimizer_step(args, state, None)
        cb.on_optimizer_step(args, state, None)
        state.global_step += 1
        cb.on_step_end(args, state, None)
        if i % 10 == 9:
            cb.on_log(args, state, None, logs={})
    return (time.perf_counter() - t0) / steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as out:
        one_run(True, 5, args.batch, args.seq, args.log_every, out)          # warm-up (imports, allocator)
        ratios, bare, overhead = [], [], []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            t = {w: one_run(w, args.steps, args.batch, args.seq, args.log_every, out) for w in order}
            ratios.append(t[True] / t[False])
            bare.append(t[False])
            overhead.append(t[True] - t[False])
    print(f"Trainer step (GPT-2 2x64, batch {args.batch} x {args.seq}, CPU, {args.threads} thread): "
          f"without callback median {statistics.median(bare) * 1e3:.2f} ms/step, {args.steps} steps x {args.rounds} rounds")
    print(f"with/without ratio: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}); goal <= 1.01")
    print(f"per-step overhead: median {statistics.median(overhead) * 1e6:+.0f} us (machine noise included)")
    own = micro(2000, args.batch, args.seq)
    print(f"callback's own cost (hooks + token count + a log line every 10 steps, no training): "
          f"{own * 1e6:.1f} us/step = {own / statistics.median(bare):.2%} of the step above")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
