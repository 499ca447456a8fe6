"""Chapter 19: DDP's bucket rule (labkit.comm.buckets) against torch's own buckets, the α–β bucket schedule,
the DDP knobs of TrainConfig, and the live count on 2 gloo ranks (labkit.comm.bucket_sweep)."""
from __future__ import annotations

import pytest

from labkit.comm import buckets as B
from labkit.train import TrainConfig

MIB = 2**20


def test_caps_follow_torch_default_and_explicit_rule():
    assert B.ddp_caps(None) == (MIB, 25 * MIB)
    assert B.ddp_caps(25) == (25 * MIB, 25 * MIB)          # passing the default value drops the 1 MiB first bucket
    assert B.ddp_caps(0.25) == (MIB // 4, MIB // 4)
    for bad in (0, -1, float("nan"), "25"):
        with pytest.raises((ValueError, TypeError), match="bucket_cap_mb"):
            B.ddp_caps(bad)


def test_assign_closes_at_or_above_the_limit_and_moves_to_the_next_limit():
    # limits [4, 7]: 3+3=6 ≥ 4 closes the first bucket; then 3+3=6 < 7 stays open to the end
    assert B.assign_buckets([3, 3, 3, 3], [4, 7]) == [[0, 1], [2, 3]]
    # a tensor larger than the limit is a bucket of its own; the last limit repeats
    assert B.assign_buckets([10, 1, 1, 10, 1], [5]) == [[0], [1, 2, 3], [4]]
    # one open bucket per key (dtype, device): keys fill separately, each with its own limit sequence
    got = B.assign_buckets([4, 2, 4, 2], [4, 100], keys=["f32", "f16", "f32", "f16"])
    assert got == [[0], [1, 3], [2]]
    with pytest.raises(ValueError, match="keys has 1 entries"):
        B.assign_buckets([1, 2], [4], keys=["a"])
    with pytest.raises(ValueError, match="limits"):
        B.assign_buckets([1], [])


def test_ddp_buckets_from_shapes_in_reverse_order():
    shapes = [(1024, 256), (256,), (256, 256), (256,)]     # 1 MiB, 1 KiB, 256 KiB, 1 KiB of fp32
    plan = B.ddp_buckets(shapes, bucket_cap_mb=0.25)
    assert plan.indices == ((3, 2), (1, 0)) and plan.nbytes == (1024 + 256 * 1024, 1024 + MIB)
    assert plan.n_buckets == 2 and plan.total_bytes == sum(plan.nbytes)
    default = B.ddp_buckets(shapes + [(256,)])  # 1 KiB + 257 KiB + 1 MiB ≥ the 1 MiB first cap; then 25 MiB
    assert default.indices == ((4, 3, 2, 1, 0),) and default.first_cap_bytes == MIB
    assert B.ddp_buckets(shapes + [(256,)] * 2).indices == ((5, 4, 3, 2, 1, 0),)
    assert B.ddp_buckets([(256,)] + shapes).indices == ((4, 3, 2, 1), (0,))   # the 1 MiB first bucket closes
    assert B.ddp_buckets(shapes, bucket_cap_mb=25).n_buckets == 1
    assert list(plan.table()["bucket"]) == [0, 1]
    with pytest.raises(ValueError, match="permutation"):
        B.ddp_buckets(shapes, order=[0, 1, 2])
    with pytest.raises(ValueError, match="empty"):
        B.ddp_buckets([])


def test_schedule_hides_all_but_the_last_bucket_and_pays_alpha_per_bucket():
    one = B.bucket_schedule([1e6], backward_s=1.0, nranks=2, alpha_s=0.0, beta_s_per_byte=1e-9)
    assert one["exposed_s"] == pytest.approx(1e-3) and one["hidden"] == 0.0   # 2(N-1)/N·S·β = S·β on 2 ranks
    two = B.bucket_schedule([5e5, 5e5], backward_s=1.0, nranks=2, alpha_s=0.0, beta_s_per_byte=1e-9)
    assert two["start_s"][0] == pytest.approx(0.5) and two["exposed_s"] == pytest.approx(5e-4)
    tiny = B.bucket_schedule([1e3] * 1000, backward_s=1e-3, nranks=2, alpha_s=1e-5, beta_s_per_byte=1e-9)
    assert tiny["comm_s"] == pytest.approx(1000 * (2e-5 + 1e-6))                # α·2(N-1) per bucket
    with pytest.raises(ValueError, match="bucket_bytes"):
        B.bucket_schedule([], backward_s=1, nranks=2, alpha_s=0, beta_s_per_byte=0)


def test_cap_sweep_is_u_shaped_when_latency_and_overlap_both_matter():
    df = B.cap_sweep(10**8, [0.01, 1, 25, 100, 10**4], backward_s=0.2, nranks=8, alpha_s=5e-6,
                     beta_s_per_byte=1 / 300e9)
    ex = list(df["exposed ms"])
    assert ex[0] > min(ex) and ex[-1] > min(ex)             # tiny caps: latency; one bucket: no overlap
    assert list(df["buckets"])[-1] == 1


def test_trainconfig_ddp_knobs_are_validated():
    TrainConfig(parallel="ddp", bucket_cap_mb=None, gradient_as_bucket_view=True, static_graph=True)
    with pytest.raises(ValueError, match="gradient_as_bucket_view.*parallel='ddp'"):
        TrainConfig(parallel="fsdp", gradient_as_bucket_view=True)
    with pytest.raises(ValueError, match="static_graph"):
        TrainConfig(parallel="single", static_graph=True)
    with pytest.raises(TypeError, match="static_graph"):
        TrainConfig(parallel="ddp", static_graph=1)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        TrainConfig(parallel="ddp", bucket_cap_mb=0)


def test_rule_matches_torch_buckets_on_one_rank(tmp_path):
    """The predicted buckets equal DDP's rebuilt buckets (torch's own log), bytes and parameter indices."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit.model.gpt import GPT, gpt_config

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        for cap in (None, 25.0, 1.0, 0.25, 0.001):
            cfg = gpt_config("tiny")
            model = GPT(cfg)
            ddp = DDP(model, bucket_cap_mb=cap)
            for _ in range(3):
                idx = torch.randint(0, cfg.vocab_size, (1, 8))
                ddp(idx, idx)[1].backward()
            d = ddp._get_ddp_logging_data()
            order = [int(x) for x in d["prev_iteration_grad_ready_order_indices"].split(",")]
            got = [int(x) for x in d["rebuilt_bucket_sizes"].split(",")]
            ready = B.ddp_buckets(model, bucket_cap_mb=cap, order=order)
            assert list(ready.nbytes) == got, cap
            assert [" ".join(map(str, b)) for b in ready.indices] == \
                [s.strip() for s in d["rebuilt_per_bucket_param_indices"].split(",")], cap
            assert B.ddp_buckets(model, bucket_cap_mb=cap).n_buckets == d["num_buckets_reduced"] == len(got), cap
    finally:
        dist.destroy_process_group()


def test_live_two_ranks_counts_parity_and_bucket_views(tmp_path):
    """On 2 gloo ranks: predicted = torch's count = the trace's all-reduces per step (× syncs of an
    accumulation); gradient_as_bucket_view and static_graph train the same losses as the default."""
    from labkit.comm.bucket_sweep import measure_buckets

    base = TrainConfig(model="tiny", seq_len=16, micro_batch=2, steps=4, warmup_steps=1, parallel="ddp",
                       bucket_cap_mb=None, peak_flops=1e12)
    cfgs = [base.replace(label="default"), base.replace(bucket_cap_mb=0.25, label="small"),
            base.replace(gradient_as_bucket_view=True, label="gav"), base.replace(static_graph=True, label="static"),
            base.replace(accum=2, no_sync=False, label="sync every micro-batch"),
            base.replace(accum=2, label="no_sync")]
    tab, recs = measure_buckets(cfgs, 2, profile_root=tmp_path)
    assert (tab["predicted"] == tab["num_buckets_reduced"]).all(), tab
    assert (tab["predicted all-reduces/step"] == tab["trace all-reduces/step"]).all(), tab
    assert tab["bytes match"].all()
    assert tab.loc["default", "predicted"] == 2 and tab.loc["small", "predicted"] > 2
    assert tab.loc["sync every micro-batch", "trace all-reduces/step"] == 2 * tab.loc["no_sync", "trace all-reduces/step"]
    assert tab.loc["gav", "grad storages"] == tab.loc["gav", "predicted"] and tab.loc["gav", "grad MB outside buckets"] == 0
    assert tab.loc["default", "grad storages"] > tab.loc["default", "predicted"]
    by = {r.label: r.loss for r in recs}
    for k in ("gav", "static"):
        assert by[k] == pytest.approx(by["default"], rel=1e-5), k
    with pytest.raises(ValueError, match="parallel='ddp'"):
        measure_buckets([base.replace(parallel="single")], 2)
