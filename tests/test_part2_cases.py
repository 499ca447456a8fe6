"""The seed cases taught in Part II (chapters 11, 13, 14), checked at library level.

Each test rebuilds a number a chapter shows from its published source, so a change in labkit that
breaks the case fails here (fast) and not only in the notebook run.
"""
from __future__ import annotations

import pytest

from labkit import comm, memory, paths


# ---------------------------------------------------------------- chapter 13: ZeRO paper, Figure 1
@pytest.mark.parametrize("strategy, expected_gb", [("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)])
def test_zero_figure1_numbers(strategy, expected_gb):
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12, decimal GB
    b = memory.model_state_bytes(7_500_000_000, strategy=strategy, n_ranks=64, precision="bf16_mixed")
    assert round(b.total / 1e9, 1) == expected_gb


def test_zero_baseline_in_gib_is_not_120():
    b = memory.model_state_bytes(7_500_000_000, strategy="ddp", n_ranks=64, precision="bf16_mixed")
    assert b.total / 2**30 == pytest.approx(111.76, abs=0.01)
    assert "GiB" in memory.fmt_bytes(b.total, unit="GiB") and "GB" in memory.fmt_bytes(b.total, unit="GB")


def test_fp32_adam_is_16_bytes_per_param_measured():
    torch = pytest.importorskip("torch")
    from labkit.model.gpt import GPT, gpt_config

    torch.manual_seed(0)
    cfg = gpt_config("tiny")
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters())
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    _, loss = model(idx, targets=idx)
    loss.backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    meas = memory.measure_model_state(model, opt)
    est = memory.model_state_bytes(n, strategy="ddp", n_ranks=1, precision="fp32")
    assert meas.params == est.params and meas.grads == est.grads
    # AdamW keeps a scalar `step` per parameter tensor on top of m and v: a few bytes, never more
    assert 0 <= meas.optimizer - est.optimizer <= 8 * len(list(model.parameters()))


# ---------------------------------------------------------------- chapter 11: BERT-large's 120 ms, which link?
def test_bert_large_gradient_allreduce_does_not_fit_pcie3_but_fits_pcie4():
    """340 M fp32 gradients (1.36 GB) on 4 ranks: a ring sends 1.5 × 1.36 GB = 2.04 GB per rank. In the
    source's 120 ms that is 17.0 GB/s — more than PCIe 3.0 x16's 15.75 GB/s line rate; PCIe 4.0 x16 carries it."""
    grad_bytes = 340e6 * 4
    pcie3_x16 = 8e9 * 16 * (128 / 130) / 8        # 15.75 GB/s per direction (PCI-SIG PCIe 3.0, §4.2)
    pcie4_x16 = 2 * pcie3_x16
    t3 = comm.ring_time("all_reduce", grad_bytes, 4, alpha=10e-6, beta=1 / pcie3_x16)
    t3_real = comm.ring_time("all_reduce", grad_bytes, 4, alpha=10e-6, beta=1 / (0.8 * pcie3_x16))
    t4 = comm.ring_time("all_reduce", grad_bytes, 4, alpha=10e-6, beta=1 / pcie4_x16)
    assert t3 > 0.120 and 0.155 < t3_real < 0.165          # slower than the source even at the full line rate
    assert t4 < 0.120 * 0.6                                 # PCIe 4.0 at ~54% of its line rate gives 120 ms
    assert comm.busbw("all_reduce", grad_bytes, 0.120, 4) / 1e9 == pytest.approx(17.0, abs=0.05)


def test_ring_allreduce_is_reduce_scatter_plus_all_gather():
    for n in (2, 4, 8, 64):
        assert comm.ring_steps("all_reduce", n) == comm.ring_steps("reduce_scatter", n) + comm.ring_steps("all_gather", n)
        ar = comm.ring_time("all_reduce", 1e8, n, alpha=5e-6, beta=1e-10)
        parts = (comm.ring_time("reduce_scatter", 1e8, n, alpha=5e-6, beta=1e-10)
                 + comm.ring_time("all_gather", 1e8, n, alpha=5e-6, beta=1e-10))
        assert ar == pytest.approx(parts)


# ---------------------------------------------------------------- chapter 11: recorded artefacts
def _nt(name):
    return comm.parse_nccl_tests(paths.dataset("comm", name).read_text())


def test_recorded_nccl_tests_show_the_seed_case():
    inside = _nt("nccl_tests_all_reduce_pcie_node_8gpu.SYNTHETIC.txt")
    across = _nt("nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt")
    assert not inside.errors and not across.errors
    big_inside = float(inside.rows["oop_busbw"].iloc[-1])
    big_across = float(across.rows["oop_busbw"].iloc[-1])
    assert 18 < big_inside < 26                   # ~22 GB/s inside a node
    assert big_across < 25e9 / 8 / 1e9 * 1.05     # at or under the 25 Gb/s line rate (3.125 GB/s)
    assert big_inside / big_across > 5
    assert inside.implied_bus_factor().iloc[-1] == pytest.approx(comm.bus_factor("all_reduce", inside.nranks), rel=0.02)


def test_recorded_alpha_beta_fit_recovers_the_fabric():
    across = _nt("nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt")
    fit = comm.fit_alpha_beta(across.rows["size"], across.rows["oop_time_us"] * 1e-6, "all_reduce", across.nranks)
    assert 2.5e9 < fit.bandwidth < 3.3e9
    held = across.rows.iloc[1::2]
    err = (fit.predict(held["size"].to_numpy()) / (held["oop_time_us"].to_numpy() * 1e-6) - 1)
    assert abs(err).max() < 0.25


def test_recorded_nccl_debug_log_names_sockets():
    info = comm.parse_nccl_debug(paths.dataset("comm", "nccl_debug_2node_25gbe.SYNTHETIC.log").read_text())
    assert info.network == "Socket" and info.nnodes == 2
    assert any(k.startswith("NET/Socket") for k in info.transports)


# ---------------------------------------------------------------- chapter 14: recorded (synthetic) GPU runs
@pytest.mark.parametrize("spec_kw, family", [
    ({"comm_us": 4000, "hidden_us": 500, "straggler_rank": 5, "straggler_us": 1200}, "communication"),
    ({"comm_us": 1000, "hidden_us": 800, "host_wait_us": 3500, "data_wait": True}, "data"),
])
def test_diagnose_names_the_family_of_the_chapter14_recorded_runs(tmp_path, spec_kw, family):
    from labkit import diagnose, trace
    from labkit.record import RunRecord, Stat
    from labkit.trace import synthetic

    spec = synthetic.SyntheticSpec(world_size=8, steps=4, compute_us=6000, seed=0, **spec_kw)
    synthetic.write_traces(spec, tmp_path)
    ana = trace.analyze(tmp_path)
    per_step = ana.step_breakdown.groupby("step")["total"].max()
    rec = ana.update_record(RunRecord(label=family, n_devices=8, step_time=Stat.of(per_step)))
    dx = diagnose.diagnose(rec, ana)
    assert dx.primary == family, dx.report()
    top = next(f for f in dx.findings if f.family == family)
    assert top.evidence and top.advice
    if family == "communication":
        assert top.evidence.get("straggler_rank") == 5
