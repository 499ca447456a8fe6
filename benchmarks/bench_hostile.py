"""Hostile input against the APIs added since round two and the CLI (issue #37): a seeded set of bad values
(NaN, ±inf, negative, 0, huge, wrong types, the string 'False', empty, a FIFO, a device), each call run in a
forked child under a 1.5 GB address-space limit and a 5 s clock, classified as

  clear      a ValueError/TypeError raised from labkit, or exit 2 with one line on stderr (no traceback)
  correct    a finite result (inputs that are odd but valid)
  traceback  any other exception, or a CLI traceback / exit other than 0 or 2
  garbage    a NaN, inf or negative figure returned
  hang       no answer in 5 s
  memory     over 1.5 GB (MemoryError or killed)

and prints each class's count and the share of clear-or-correct outcomes.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_hostile.py [--seed 0] [--show BAD]
"""
from __future__ import annotations

import argparse
import io
import math
import os
import random
import resource
import signal
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout

NAN, INF = float("nan"), float("inf")
BAD = [NAN, INF, -INF, -1.0, 0, 0.0, 1e308, 10**400, "False", "1e3", None, [1.0], True, "", {}]


def _api_cases(rng: random.Random, fifo: str) -> list:
    from labkit.comm.env import check_env
    from labkit.kernels import fusion
    from labkit.measure import series as regress_series
    from labkit.model import expert_load as moe_stats
    from labkit.perf import scheduling
    from labkit.perf.validate import fit, stage_times, tp_cycle
    from labkit.trace.synthetic import SyntheticSpec
    from labkit.train import ring_attention
    from labkit.tuning import accumulation as tune_accum

    base = {
        "ring_attention.chunk_ids": (ring_attention.chunk_ids, dict(rank=0, cp=2, balanced=True)),
        "ring_attention.chunk_pairs": (ring_attention.chunk_pairs, dict(cp=2, balanced=True)),
        "fusion.graph_step_us": (fusion.graph_step_us, dict(n_kernels=10, kernel_us=5.0, launch_us=3.0,
                                                            graphed=True)),
        "scheduling.jobs": (scheduling.jobs, dict(seed=0, hours=24.0, arrivals_per_h=2.0, max_gpus=8,
                                                  mean_job_h=3.0)),
        "scheduling.simulate": (scheduling.simulate, dict(hours=12.0, arrivals_per_h=2.0, nodes=2,
                                                          gpus_per_node=4, max_gpus=8)),
        "moe_stats.load_imbalance": (moe_stats.load_imbalance, dict(counts=[3, 1, 2, 2])),
        "moe_stats.balance_loss": (moe_stats.balance_loss, dict(fractions=[0.5, 0.5], probs=[0.4, 0.6])),
        "perf_validate.PartTimes": (stage_times.PartTimes, dict(embed_s=1e-3, block_s=2e-3, tail_s=3e-3,
                                                                 n_layers=4)),
        "perf_validate.fit_tp_cycle": (tp_cycle.fit_tp_cycle, dict(act_bytes=[1e5, 2e5], cost_s=[1e-4, 2e-4],
                                                                   nranks=4, tp=2)),
        "perf_validate.fit_unit_cycle": (fit.fit_unit_cycle, dict(unit_bytes=[1e6, 2e6], cost_s=[1e-3, 2e-3],
                                                                  nranks=2)),
        "trace.SyntheticSpec": (SyntheticSpec, dict(world_size=2, steps=4, data_wait=False)),
        "comm.env.check_env": (check_env, dict(env="NCCL_ALGO=Tree", template=False)),
        "regress_series.size_monitor": (regress_series.size_monitor, dict(sigma=0.1)),
    }
    if hasattr(tune_accum, "collectives_per_step"):
        import inspect
        sig = inspect.signature(tune_accum.collectives_per_step)
        if all(p.default is not p.empty for p in sig.parameters.values()):
            base["tune_accum.collectives_per_step"] = (tune_accum.collectives_per_step, {})
    cases = []
    for name, (fn, kw) in base.items():
        for param in kw:
            for value in rng.sample(BAD, 6):
                cases.append((f"{name}({param}={value!r:.30})", "api", (fn, {**kw, param: value})))
    cases.append(("check_env(120 kB line)", "api", (check_env, dict(env="NCCL_" + "A" * 120_000))))
    return cases


def _cli_cases(fifo: str, tmp: str) -> list:
    big = os.path.join(tmp, "big.txt")
    with open(big, "w") as f:
        f.write("1" * 401 + "\n" + "1.0\n" * 8)
    argvs = [
        ["comm", "parse", fifo], ["comm", "env", fifo], ["diagnose", "--record", fifo], ["trace", "analyze", fifo],
        ["regress", "monitor", fifo, "--baseline-runs", "3", "--candidate-runs", "1"],
        ["regress", "monitor", big, "--baseline-runs", "3", "--candidate-runs", "1"],
        ["comm", "parse", "/dev/zero"], ["comm", "parse", "/dev/null"], ["comm", "parse", tmp],
        ["trace", "synth", "--steps", "10000000", os.path.join(tmp, "t")],
        ["trace", "synth", "--steps", "-3", os.path.join(tmp, "t2")],
        ["comm", "bench", "--max-bytes", "1e30"], ["comm", "bench", "--max-bytes", "nan"],
        ["launch", "os:nope"], ["launch", "os:sep"], ["run", "-n", "0"], ["run", "-n", "-2"],
        ["run", "-n", "2", "--moe-experts", "4", "--ep", "4", "--steps", "4", "--warmup-steps", "1"],
        ["run", "-n", "2", "--fail-at-step", "1", "--fail-rank", "7", "--checkpoint-dir", tmp,
         "--checkpoint-every", "1", "--steps", "4", "--warmup-steps", "1"],
        ["comm", "model", "--size", "1e999", "--nranks", "2", "--bw-gbs", "10"],
        ["comm", "model", "--size", "1M", "--nranks", "0", "--bw-gbs", "nan"],
        ["mfu", "--help-not-an-option"],
    ]
    return [(" ".join(a)[:70], "cli", a) for a in argvs]


def _classify_result(r) -> str:
    vals = r if isinstance(r, (list, tuple)) else [r]
    for v in vals:
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v) or v < 0):
            return "garbage"
    return "correct"


def _child(kind, payload, wfd):
    resource.setrlimit(resource.RLIMIT_AS, (int(1.5 * 2**30),) * 2)
    out = "traceback"
    try:
        if kind == "api":
            fn, kw = payload
            try:
                out = _classify_result(fn(**kw))
            except (ValueError, TypeError) as e:     # clear: a ValueError (ArgumentTypeError is one) from labkit
                import traceback
                where = traceback.extract_tb(e.__traceback__)[-1].filename
                out = "clear" if isinstance(e, ValueError) and "/labkit/" in where and str(e) else "traceback"
            except MemoryError:
                out = "memory"
            except Exception:
                out = "traceback"
        else:
            from labkit.cli import main
            err = io.StringIO()
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                try:
                    rc = main(payload)
                except SystemExit as e:
                    rc = e.code
                except MemoryError:
                    rc = "memory"
            text = err.getvalue().strip()
            if rc == "memory":
                out = "memory"
            elif rc == 2 and "Traceback" not in text and text:
                out = "clear"
            elif rc == 0 and payload[0] in ("comm",) and payload[1] == "model":
                out = "correct"
            else:
                out = "traceback" if rc not in (0, 2) or "Traceback" in text else "garbage"
    finally:
        os.write(wfd, out.encode())
        os._exit(0)


def run_case(kind, payload, limit_s=5.0) -> str:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(kind, payload, w)
    os.close(w)
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError()))
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        data = os.read(r, 64)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutError:
        data = b"hang"
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)     # our own child; any ranks it started die with their parent watch
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    if not data:
        return "memory" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL else "traceback"
    return data.decode()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", default="", help="print the cases of these classes (comma-separated)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="labkit-hostile-") as tmp:
        fifo = os.path.join(tmp, "pipe")
        os.mkfifo(fifo)
        cases = _api_cases(rng, fifo) + _cli_cases(fifo, tmp)
        counts: dict[str, int] = {}
        show = set(filter(None, args.show.split(",")))
        for label, kind, payload in cases:
            c = run_case(kind, payload)
            counts[c] = counts.get(c, 0) + 1
            if c in show:
                print(f"  {c:<9} {kind} {label}")
    ok = counts.get("clear", 0) + counts.get("correct", 0)
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"clear or correct: {ok} of {len(cases)} = {ok / len(cases):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
