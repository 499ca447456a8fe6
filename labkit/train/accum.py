"""Does gradient accumulation give the gradient of the whole batch? Measured, on the one loop's code.

With the loss of each of the k micro-batches divided by k (:func:`labkit.train.loop.forward_backward`),
the accumulated gradient is the gradient of the mean loss over the k·b sequences — *when every
micro-batch's loss is a mean over the same number of tokens and no layer looks across the batch*:

    ∇ (1/k) Σ_j mean_{t ∈ B_j} ℓ_t  =  ∇ mean_{t ∈ B} ℓ_t     iff |B_j| = |B|/k for every j

:func:`gradient_parity` measures it on the reference GPT (same seed, same sequences, one batch vs k
micro-batches): max |difference|, relative difference and the two gradient norms. Two cases break it:

- **unequal token counts** (``pad_share`` > 0: the second half's sequences end early, their padding ignored with
  ``ignore_index=-100``): each micro-batch's mean divides by its *own* count of real tokens, so the
  tokens of a short micro-batch weigh more. The fix (``reduction="tokens"``) sums the token losses
  and divides by the global count of real tokens (what Hugging Face's ``num_items_in_batch`` passes);
- **batch statistics** (:func:`batchnorm_parity`): BatchNorm normalises by the mean and variance of
  *the micro-batch*, so k micro-batches are normalised differently from one batch; LayerNorm (the GPT's,
  per token) is not affected.

Because the two gradients agree, so do their norms: a gradient-clipping threshold needs no change
under accumulation (clip once, after the last micro-batch). Sources: ../shared/course/FACTS.md
"Accumulation"; Goyal et al. 2017 §2.3 (BatchNorm statistics are per worker batch).

Taught in chapter 15 (micro-batch and accumulation); :func:`grad_norms` in chapter 25 (the clipping threshold).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks
from labkit.train.config import TrainConfig

REDUCTIONS = ("mean", "tokens")


@dataclass(frozen=True)
class Parity:
    """One batch against its accumulation: gradient norms, max |Δ|, relative ‖Δ‖ and allclose.
    Taught in chapter 15."""

    sequences: int
    micro_batch: int
    accum: int
    reduction: str
    pad_share: float
    norm_full: float
    norm_accum: float
    max_abs_diff: float
    rel_diff: float          # ‖g_accum − g_full‖ / ‖g_full‖
    allclose: bool           # torch.allclose(g_accum, g_full, rtol=1e-4, atol=1e-6)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def global_batch(cfg: TrainConfig, sequences: int, *, pad_share: float = 0.0, seed: int = 0):
    """``sequences`` (x, y) windows of the course's token corpus (seeded); with ``pad_share`` > 0 every
    sequence of the batch's second half ends early, the rest of its targets set to -100 (ignored):
    ``pad_share`` of all target tokens in all, and micro-batches of unequal real-token counts. Taught in chapter 15."""
    import torch

    from labkit import data

    n = checks.count("sequences", sequences)
    pad = checks.fraction("pad_share", pad_share, open_high=True)
    seq = cfg.model_config.seq_len
    ds = data.TokenDataset(data.load_tokens(), seq)
    g = torch.Generator().manual_seed(checks.count("seed", seed, at_least=0))
    idx = torch.randperm(len(ds), generator=g)[:n].tolist()
    if len(idx) < n:
        raise ValueError(f"sequences={n} is more than the corpus holds ({len(ds)} of {seq} tokens)")
    x = torch.stack([torch.as_tensor(ds[i][0]).long() for i in idx])
    y = torch.stack([torch.as_tensor(ds[i][1]).long() for i in idx])
    if pad:
        short = list(range(n // 2, n))                      # the second half are short documents
        cut = max(1, min(seq - 1, round(seq * (1 - pad * n / max(1, len(short))))))
        for i in short:
            y[i, cut:] = -100
    return x, y


def accumulated_gradient(cfg: TrainConfig, x, y, *, micro_batch: int, reduction: str = "mean"):
    """The flat gradient of the GPT of ``cfg`` (seeded: the same initial weights every call) on the
    batch (x, y) taken as ``len(x) / micro_batch`` micro-batches. ``reduction="mean"``: the training
    loop's own accumulation (:func:`labkit.train.loop.forward_backward`, each micro-batch's mean loss ÷
    k); ``"tokens"``: each micro-batch's summed token loss ÷ the batch's real tokens. Taught in chapter 15."""
    import torch
    import torch.nn.functional as F

    from labkit.train.loop import build_model, forward_backward

    checks.one_of("reduction", reduction, REDUCTIONS)
    mb = checks.count("micro_batch", micro_batch)
    if len(x) % mb:
        raise ValueError(f"micro_batch={mb} does not divide the batch of {len(x)} sequences")
    k = len(x) // mb
    run = cfg.replace(parallel="single", micro_batch=mb, accum=k, checkpoint=False, compile=False)
    device = torch.device("cpu")
    model = build_model(run, device)
    chunks = list(zip(x.split(mb), y.split(mb), strict=True))
    if reduction == "mean":
        forward_backward(model, iter(chunks), run, device)
    else:
        real = int((y != -100).sum())
        for xc, yc in chunks:
            logits, _ = model(xc)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), yc.reshape(-1), reduction="sum")
            (loss / real).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def _compare(full, acc, **facts) -> Parity:
    import torch

    d = acc - full
    return Parity(**facts, norm_full=float(full.norm()), norm_accum=float(acc.norm()),
                  max_abs_diff=float(d.abs().max()), rel_diff=float(d.norm() / full.norm()),
                  allclose=bool(torch.allclose(acc, full, rtol=1e-4, atol=1e-6)))


def gradient_parity(cfg: TrainConfig, sequences: int, micro_batch: int, *, pad_share: float = 0.0,
                    reduction: str = "mean", seed: int = 0) -> Parity:
    """The gradient of one batch of ``sequences`` against its accumulation in micro-batches of
    ``micro_batch`` (see the module docstring). Taught in chapter 15."""
    x, y = global_batch(cfg, sequences, pad_share=pad_share, seed=seed)
    full = accumulated_gradient(cfg, x, y, micro_batch=len(x), reduction=reduction)
    acc = accumulated_gradient(cfg, x, y, micro_batch=micro_batch, reduction=reduction)
    return _compare(full, acc, sequences=len(x), micro_batch=micro_batch, accum=len(x) // micro_batch,
                    reduction=reduction, pad_share=float(pad_share))


def batchnorm_parity(sequences: int = 16, micro_batch: int = 4, *, norm: str = "batch", width: int = 64,
                     seed: int = 0) -> Parity:
    """The same comparison on a two-layer MLP with a BatchNorm1d (``norm="batch"``) or a LayerNorm
    (``"layer"``) between its layers, inputs seeded: batch statistics break parity, per-sample ones do
    not. Taught in chapter 15."""
    import torch

    checks.one_of("norm", norm, ("batch", "layer"))
    n, mb, w = checks.count("sequences", sequences), checks.count("micro_batch", micro_batch), checks.count("width", width)
    if n % mb or mb < 2:
        raise ValueError(f"micro_batch={mb} must be >= 2 (BatchNorm needs 2 samples) and divide sequences={n}")
    g = torch.Generator().manual_seed(seed)
    x, t = torch.randn(n, w, generator=g), torch.randn(n, 1, generator=g)

    def grad(size):
        torch.manual_seed(seed)
        layer = torch.nn.BatchNorm1d(w) if norm == "batch" else torch.nn.LayerNorm(w)
        net = torch.nn.Sequential(torch.nn.Linear(w, w), layer, torch.nn.ReLU(), torch.nn.Linear(w, 1))
        k = n // size
        for xc, tc in zip(x.split(size), t.split(size), strict=True):
            (torch.nn.functional.mse_loss(net(xc), tc) / k).backward()
        return torch.cat([p.grad.reshape(-1) for p in net.parameters()])

    return _compare(grad(n), grad(mb), sequences=n, micro_batch=mb, accum=n // mb, reduction=f"{norm}norm",
                    pad_share=0.0)


def grad_norms(cfg, accums=(1, 2, 4, 8), *, summed: bool = False) -> dict[int, float]:
    """The global gradient norm after accumulating k micro-batches of ``cfg`` (fresh seeded model, the loop's
    own :func:`~labkit.train.loop.forward_backward`, the first k micro-batches of the seeded data stream) for
    each k: each micro-batch's loss ÷ k (the loop's way, ``summed=False``), or summed over micro-batches
    (× k: what the source's ``max_norm = 0.1·√k`` assumes). Taught in chapter 25 (the clipping threshold)."""
    import torch

    from labkit.train.loop import _batches, build_model, forward_backward

    if not accums:
        raise ValueError("accums must name at least one accumulation")
    ks = [checks.count("accum", k) for k in accums]
    cpu = torch.device("cpu")
    model = build_model(cfg, cpu)          # one seeded model; gradients cleared between accumulations
    out = {}
    for k in ks:
        model.zero_grad(set_to_none=True)
        forward_backward(model, _batches(cfg, 0.0, 1, cpu), cfg, cpu, accum=k)
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        out[k] = float(g.norm()) * (k if summed else 1)
    return out
