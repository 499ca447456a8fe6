"""labkit.integrations: the Hugging Face Trainer callback (a real Trainer run on the CPU) and the
plain-loop meter; FLOPs per token from transformers configs built offline."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from labkit import flops
from labkit.integrations import flops_per_token_of, meter_for
from labkit.integrations.shapes import matmul_params, shape_from_config

transformers = pytest.importorskip("transformers")


def _tiny_gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def test_gpt2_config_gives_the_gpt2_124m_shape():
    s = shape_from_config(transformers.GPT2Config())
    assert replace(s, name="") == replace(flops.preset("gpt2-124m"), name="")


def test_llama_config_gives_the_llama3_8b_shape():
    # Llama-3-8B's published config.json values (num_hidden_layers 32, hidden_size 4096, 32 heads,
    # 8 KV heads, intermediate_size 14336, vocab 128256, untied), built offline
    cfg = transformers.LlamaConfig(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                                   max_position_embeddings=8192, tie_word_embeddings=False)
    s = shape_from_config(cfg)
    assert flops.model_flops_per_token(s) == flops.model_flops_per_token(flops.preset("llama3-8b"))


def test_flops_of_a_model_match_its_parameter_count():
    """The config route and the parameter route agree on N for GPT-2 (6N convention, tied embeddings)."""
    model = _tiny_gpt2()
    by_config, how = flops_per_token_of(model, method="6N")
    assert how.startswith("6N:config")
    # GPT-2's N: every parameter except the position table (the tied token table counts as the output layer)
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    assert by_config == 6.0 * n
    assert matmul_params(model) == n                  # wte tied to lm_head counts once, wpe is a lookup
    plain = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3))
    assert flops_per_token_of(plain) == (6.0 * (4 * 3 + 3), "6N:parameters")


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="config"):
        shape_from_config(SimpleNamespace(hidden_size=8))
    with pytest.raises(TypeError, match="model"):
        flops_per_token_of(42)
    with pytest.raises(ValueError, match="tokens_per_step"):
        meter_for(torch.nn.Linear(2, 2), tokens_per_step=0)
    with pytest.raises(ValueError, match="flops_per_token"):
        meter_for(tokens_per_step=8)
    from labkit.integrations.hf import ThroughputCallback

    with pytest.raises(ValueError, match="peak"):
        ThroughputCallback(peak=-1.0)
    with pytest.raises(ValueError, match="method"):
        ThroughputCallback(method="8N")


def test_meter_for_a_plain_loop_reports_tokens_per_s_and_mfu():
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = meter_for(model, tokens_per_step=4 * 8, dtype="fp32", peak="H100-SXM", warmup_steps=1)
    assert meter.device == "cpu" and meter.peak_source.startswith("catalogue:")
    for _ in range(3):
        x = torch.randint(0, 32, (4, 8))
        with meter.step():
            with meter.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            with meter.phase("backward"):
                loss.backward()
            with meter.phase("optimizer"):
                opt.step()
                opt.zero_grad()
    s = meter.summary()
    assert s["n_steps"] == 2 and s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1
    assert set(s["phases"]) == {"forward", "backward", "optimizer"}


def test_the_callback_driven_by_hand_counts_masked_tokens():
    """The hooks in the Trainer's order, with a fake args/state: tokens = attention_mask sum."""
    from labkit.integrations.hf import ThroughputCallback

    model = _tiny_gpt2()
    cb = ThroughputCallback(peak=1e12, warmup_steps=1)
    args = SimpleNamespace(bf16=False, fp16=False, device=torch.device("cpu"), world_size=2)
    state = SimpleNamespace(log_history=[], global_step=0)
    cb.on_train_begin(args, state, None, model=model)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0                                    # 26 real tokens of 32
    for _ in range(3):
        cb.on_step_begin(args, state, None)
        model(input_ids=torch.randint(0, 256, (2, 16)), attention_mask=mask)
        cb.on_pre_optimizer_step(args, state, None)
        cb.on_optimizer_step(args, state, None)
        state.global_step += 1
        cb.on_step_end(args, state, None)
    state.log_history.append({"loss": 1.0, "step": state.global_step})
    logs = {"loss": 1.0}
    cb.on_log(args, state, None, logs=logs)
    cb.on_train_end(args, state, None)
    times = cb.meter.step_times
    assert len(times) == 2
    assert logs["labkit/tokens_per_s_per_device"] == pytest.approx(2 * 26 / sum(times))
    assert logs["labkit/tokens_per_s"] == pytest.approx(2 * logs["labkit/tokens_per_s_per_device"])
    fpt, _ = flops_per_token_of(model, seq_len=16)
    assert logs["labkit/mfu"] == pytest.approx(logs["labkit/tokens_per_s_per_device"] * fpt / 1e12)
    assert {"labkit/data_s", "labkit/forward_backward_s", "labkit/optimizer_s"} <= set(logs)
    assert state.log_history[-1]["labkit/mfu"] == logs["labkit/mfu"]
    model(input_ids=torch.randint(0, 256, (1, 4)))      # hook removed after training: nothing counted
    assert cb._tokens is None


def test_a_real_trainer_run_on_cpu_logs_tokens_per_s_and_mfu(tmp_path, monkeypatch, calibrated_peaks):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (in labkit[dev])")
    import transformers.trainer as hf_trainer

    from labkit.integrations.hf import ThroughputCallback

    # the repository's own datasets/ folder is importable from its root and would pass for HF `datasets`
    monkeypatch.setattr(hf_trainer, "is_datasets_available", lambda: False)

    class Synthetic(torch.utils.data.Dataset):
        def __len__(self):
            return 48

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 256, (32,), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(32, dtype=torch.long), "labels": ids}

    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=4,
                                          logging_steps=3, report_to=[], use_cpu=True, save_strategy="no",
                                          disable_tqdm=True)
    cb = ThroughputCallback()                            # FLOPs from the config, the CPU's peak
    trainer = transformers.Trainer(model=_tiny_gpt2(), args=args, train_dataset=Synthetic(), callbacks=[cb])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == [3, 6]
    for h in logged:
        assert h["labkit/tokens_per_s"] > 0 and 0 < h["labkit/mfu"] < 1
        assert h["labkit/step_time_s"] > 0 and "labkit/forward_backward_s" in h
    assert cb.meter.n_steps == 4                          # 6 steps, 2 of warm-up


def test_labkits_own_gpt_is_read_from_its_config():
    """meter_for / flops_per_token_of on the course's GPT: its GPTConfig's shape, not a transformers reader."""
    from labkit.model.gpt import GPT, gpt_config

    cfg = gpt_config("tiny")
    fpt, how = flops_per_token_of(GPT(cfg))
    assert how == "palm:labkit GPTConfig" and fpt == flops.model_flops_per_token(cfg.shape(), method="palm")
    fpt32, _ = flops_per_token_of(GPT(cfg), seq_len=32)
    assert fpt32 < fpt                                   # the attention term shrinks with the sequence
    meter = meter_for(GPT(cfg), tokens_per_step=4 * cfg.seq_len, dtype="fp32")
    assert meter.flops_per_token == fpt
