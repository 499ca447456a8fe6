"""labkit.memory.deepspeed: DeepSpeed's ZeRO-2/3 model-state estimators reproduced, and compared with labkit's."""
from __future__ import annotations

import pytest

from labkit import memory
from labkit.memory import deepspeed as ds

# DeepSpeed's documentation, "Memory Requirements" (docs/code-docs/source/memory.rst, microsoft/DeepSpeed
# at 38327e07, https://deepspeed.readthedocs.io/en/latest/memory.html): the `_all_cold` examples for t5-3b
# (total_params=2851e6, largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=1), printed lines quoted.
DOC_ZERO2 = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params.
  per CPU  |  per GPU |   Options
  127.45GB |   5.31GB | offload_optimizer=cpu
  127.45GB |  15.93GB | offload_optimizer=none"""

DOC_ZERO3 = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params, 32M largest layer params.
  per CPU  |  per GPU |   Options
   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1
  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1
  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0"""


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]     # the docs' code block drops trailing blanks


def test_zero3_reproduces_deepspeeds_printed_example_exactly():
    est = ds.deepspeed_zero3_estimate(total_params=2851e6, largest_layer_params=32e6, num_gpus_per_node=8,
                                      num_nodes=1)
    assert _lines(est.report()) == _lines(DOC_ZERO3)
    assert len(est.rows) == 6 and est.rows[0].gpu_bytes == 4 * 32_000_000


def test_zero2_reproduces_the_docs_with_the_pre_0_14_3_formula_and_the_current_formula_by_hand():
    # the docs' table predates DeepSpeed PR #5099 (v0.14.3): no-offload GPU was 4Ψ + 16Ψ/N then
    legacy = ds.deepspeed_zero2_estimate(2851e6, num_gpus_per_node=8, num_nodes=1, legacy=True)
    assert _lines(legacy.report()) == _lines(DOC_ZERO2)
    now = ds.deepspeed_zero2_estimate(2851e6, num_gpus_per_node=8, num_nodes=1)
    psi = 2851e6
    assert now.rows[1].gpu_bytes == int(2 * psi + int(18 * psi / 8))      # 2Ψ + 18Ψ/N since v0.14.3
    assert now.rows[0].gpu_bytes == int(2 * psi)
    assert now.rows[0].cpu_bytes == int(psi * max(4 * 8, 16) * 1.5)
    assert _lines(now.report())[-1] == "  127.45GB |  11.28GB | offload_optimizer=none"
    assert now.rows[0].line().startswith("  127.45GB |   5.31GB | offload_optimizer=cpu")


def test_multi_node_and_zero_init_cases_follow_the_formulas():
    psi, big = 70e9, 1e9
    est = ds.deepspeed_zero3_estimate(psi, big, num_gpus_per_node=8, num_nodes=4, additional_buffer_factor=1.0)
    by = {(r.offload_param, r.offload_optimizer, r.zero_init): r for r in est.rows}
    assert by[(True, True, True)].cpu_bytes == int(psi * 18 / 4)
    assert by[(True, True, False)].cpu_bytes == int(psi * max(4 * 8, 18 / 4))
    assert by[(False, True, True)].gpu_bytes == int(4 * big + int(2 * psi / 32))
    assert by[(False, False, True)].cpu_bytes == int(big * 4 * 8)
    assert "4 nodes, 8 GPUs per node" in est.report()
    one = ds.deepspeed_zero2_estimate(1e9)
    assert "1 node, 1 GPU per node" in one.report()


def test_all_live_counts_shared_parameters_once_and_the_largest_module():
    torch = pytest.importorskip("torch")
    emb = torch.nn.Embedding(100, 16)
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight = emb.weight                                   # tied: counted once
    model = torch.nn.Sequential(emb, torch.nn.Linear(16, 32), head)
    total, largest = ds.deepspeed_params(model)
    assert total == 1600 + 16 * 32 + 32 and largest == 1600
    with pytest.raises(ValueError, match="model"):
        ds.deepspeed_params(3)


def test_compare_with_labkit_explains_the_whole_difference():
    for stage, big in ((2, 0), (3, 32e6)):
        c = ds.compare_with_labkit(2851e6, 8, 1, stage=stage, largest_layer_params=big)
        assert c["difference_bytes"] == pytest.approx(sum(c["explained"].values()), abs=1)
        assert "GiB" in c["reason"] and "18" in c["reason"]
    c = ds.compare_with_labkit(2851e6, 8, 1, stage=3, largest_layer_params=32e6)
    assert c["labkit_bytes"] == memory.model_state_bytes(2_851_000_000, strategy="zero3", n_ranks=8).model_states


@pytest.mark.parametrize(("kw", "param"), [
    (dict(total_params=0), "total_params"), (dict(total_params="3e9"), "total_params"),
    (dict(num_gpus_per_node=0), "num_gpus_per_node"), (dict(num_nodes=1.5), "num_nodes"),
    (dict(additional_buffer_factor=-1), "additional_buffer_factor"),
    (dict(largest_layer_params=5e9), "largest_layer_params"), (dict(largest_layer_params=-1), "largest_layer_params"),
])
def test_bad_inputs_name_the_parameter(kw, param):
    args = dict(total_params=3e9, largest_layer_params=1e7, num_gpus_per_node=8, num_nodes=1) | kw
    with pytest.raises(ValueError, match=param):
        ds.deepspeed_zero3_estimate(**args)
    with pytest.raises(ValueError, match="stage"):
        ds.compare_with_labkit(3e9, stage=1)
    with pytest.raises(ValueError, match="legacy"):
        ds.deepspeed_zero2_estimate(3e9, legacy="yes")
