"""Lab 9's per-learner exercise: a SYNTHETIC GPU cluster with one limiting link, a model, a held-out size.

``labkit.comm.exercise``. A seed picks, deterministically (NumPy's PCG64):

- a **mystery cluster** (:func:`mystery_cluster`): one of :data:`CLUSTERS`, labelled SYNTHETIC, whose
  ``all_reduce_perf`` table is generated from the α–β ring model (:mod:`labkit.comm.synthetic`) with the
  limiting link running at a seeded 80–92 % of its line rate; its link sheet (:meth:`MysteryCluster.sheet`)
  lists every link of the cluster with the busbw it can carry, and the learner names the one that limits the
  table — the link *on the run's path* (the table's rank lines say whether the ranks span one node or two)
  whose ceiling the table's busbw comes closest to;
- a **model** (:data:`MODELS`, published shapes of :func:`labkit.flops.preset`) whose fp32 gradient
  all-reduce the learner predicts;
- a **held-out message size** (:data:`HELD_OUT`, 3·2^k bytes, between the benchmark's powers of two).

**The busbw ceiling of each link** (per rank, bytes/s per direction), the model the generator uses:

==========  ===================================================================================
gpu-gpu     the GPU's intra-node link: NVLink per direction (half the bidirectional figure NVIDIA quotes:
            H100 SXM 900 GB/s → 450, A100 SXM 600 → 300), or PCIe P2P where there is no NVLink
nic-pcie    the PCIe slot of each NIC × NICs per node: a ring crossing nodes spreads its channels over the
            node's NICs, and each NIC's traffic crosses its slot (GPUDirect RDMA)
network     NIC line rate (Gb/s ÷ 8) × NICs per node, for the same reason
==========  ===================================================================================

PCIe per direction = GT/s × lanes × 128/130 ÷ 8 bytes (PCIe 3.0+ use 128b/130b encoding; PCI-SIG base
specification): Gen3 x16 15.75 GB/s, Gen4 x16 31.5, Gen5 x16 63. nccl-tests' busbw is defined so it can be
held against these figures (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``): a bandwidth-bound ring's busbw
approaches the slowest link on its path and can never exceed it. A one-node run crosses only gpu-gpu.

Taught in lab 9 (``labs/lab09_collectives``), on chapter 11 (communication diagnostics).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from labkit import checks
from labkit.comm.synthetic import Fabric, synthetic_nccl_tests

__all__ = ["CLUSTERS", "HELD_OUT", "LINKS", "MODELS", "Assignment", "MysteryCluster", "assignment",
           "heldout_tolerance", "mystery_cluster", "pcie_bw"]

LINKS = ("gpu-gpu", "nic-pcie", "network")
#: Published shapes (labkit.flops.preset) whose fp32 gradient all-reduce lab 9 predicts.
MODELS = ("gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "llama3-8b")
#: Held-out all-reduce sizes (bytes): 3·2^k, between the powers of two the lab benchmarks.
HELD_OUT = tuple(3 * 2**k for k in range(14, 19))


def pcie_bw(gen: int, lanes: int) -> float:
    """Bytes/s per direction of a PCIe link: GT/s × lanes × 128/130 ÷ 8 (Gen 3, 4, 5). Taught in lab 9."""
    rates = {3: 8e9, 4: 16e9, 5: 32e9}
    gen = checks.one_of("gen", gen, tuple(rates))
    lanes = checks.one_of("lanes", lanes, (1, 2, 4, 8, 16))
    return rates[gen] * lanes * 128 / 130 / 8


@dataclass(frozen=True)
class MysteryCluster:
    """A SYNTHETIC cluster: its hardware, the nodes an ``all_reduce_perf`` run spans, and one table.

    Every bandwidth is bytes/s per direction. Taught in lab 9.
    """

    name: str
    gpu: str
    gpus_per_node: int
    nodes: int                 # nodes the table's run spans (1: only gpu-gpu is on its path)
    intra: str                 # the gpu-gpu link, as a vendor names it
    intra_bw: float
    nics_per_node: int
    nic_gbps: float            # line rate of one NIC port, Gb/s
    nic_pcie: tuple            # (gen, lanes) of each NIC's slot
    efficiency: float = 0.85   # share of its ceiling the limiting link reaches (seeded)
    seed: int = 0

    @property
    def nranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def ceilings(self) -> dict:
        """busbw ceiling (bytes/s) of every link of the cluster, per rank (module docstring)."""
        return {"gpu-gpu": self.intra_bw, "nic-pcie": self.nics_per_node * pcie_bw(*self.nic_pcie),
                "network": self.nics_per_node * self.nic_gbps * 1e9 / 8}

    def on_path(self) -> tuple:
        """The links the table's ring crosses: gpu-gpu on one node, all three across nodes."""
        return LINKS if self.nodes > 1 else ("gpu-gpu",)

    def fabric(self) -> Fabric:
        """The :class:`~labkit.comm.synthetic.Fabric` whose α–β model generates the table."""
        c = self.ceilings()
        inter = min(c["nic-pcie"], c["network"])
        return _Hidden(self.name, self.gpu, self.nodes, self.gpus_per_node, intra_alpha_s=2.0e-6,
                       intra_bw=self.efficiency * c["gpu-gpu"], inter_alpha_s=8.0e-6 if self.nodes > 1 else 0.0,
                       inter_bw=self.efficiency * inter, network="IB" if self.nic_gbps >= 200 else "Socket",
                       seed=self.seed)

    def table(self) -> str:
        """The SYNTHETIC ``all_reduce_perf`` output (8 B .. 1 GiB, ×2), the same text for the same seed."""
        return synthetic_nccl_tests(self.fabric(), "all_reduce", min_bytes=8, max_bytes=2**30, factor=2,
                                    noise=0.02, seed=self.seed)

    def sheet(self) -> pd.DataFrame:
        """The link sheet a learner reads: each link's hardware, count, per-direction rate and busbw ceiling."""
        c = self.ceilings()
        gen, lanes = self.nic_pcie
        rows = [("gpu-gpu", self.intra, self.gpus_per_node, self.intra_bw),
                ("nic-pcie", f"PCIe Gen{gen} x{lanes} slot of each NIC", self.nics_per_node, pcie_bw(gen, lanes)),
                ("network", f"{self.nic_gbps:g} Gb/s NIC port", self.nics_per_node, self.nic_gbps * 1e9 / 8)]
        return pd.DataFrame([{"link": k, "hardware": hw, "per node": n, "GB/s each (per direction)": bw / 1e9,
                              "busbw ceiling (GB/s)": c[k] / 1e9} for k, hw, n, bw in rows]).set_index("link")

    def describe(self) -> str:
        return (f"SYNTHETIC cluster {self.name!r} (seed {self.seed}): nodes of {self.gpus_per_node} {self.gpu}, "
                f"{self.intra}; {self.nics_per_node} x {self.nic_gbps:g} Gb/s NICs per node on PCIe "
                f"Gen{self.nic_pcie[0]} x{self.nic_pcie[1]}")


@dataclass(frozen=True)
class _Hidden(Fabric):
    """The generator's fabric, whose table header names the seed instead of the answer."""

    seed: int = 0

    def describe(self) -> str:
        return (f"lab 9 mystery cluster (seed {self.seed}): {self.nodes} node(s) x {self.gpus_per_node} {self.gpu}; "
                "link sheet: labkit.comm.exercise.mystery_cluster(seed).sheet()")


# Labelled hardware, each with one clear bottleneck (the next link on the path is >= 2.5x faster), and the
# one-node runs with links off the path that a learner must not name. SYNTHETIC: no such run was made.
_H100 = dict(gpu="NVIDIA H100 80GB HBM3", intra="NVLink 4 (900 GB/s bidirectional)", intra_bw=450e9)
_A100 = dict(gpu="NVIDIA A100-SXM4-80GB", intra="NVLink 3 (600 GB/s bidirectional)", intra_bw=300e9)
_A10 = dict(gpu="NVIDIA A10", intra="PCIe Gen4 x16 P2P (no NVLink)", intra_bw=pcie_bw(4, 16))
CLUSTERS = {
    "h100-2node-100gbe": MysteryCluster("h100-2node-100gbe", gpus_per_node=8, nodes=2, nics_per_node=2,
                                        nic_gbps=100, nic_pcie=(4, 16), **_H100),
    "a100-2node-x4-slots": MysteryCluster("a100-2node-x4-slots", gpus_per_node=8, nodes=2, nics_per_node=4,
                                          nic_gbps=200, nic_pcie=(4, 4), **_A100),
    "a10-2node-hdr": MysteryCluster("a10-2node-hdr", gpus_per_node=8, nodes=2, nics_per_node=4, nic_gbps=200,
                                    nic_pcie=(4, 16), **_A10),
    "a10-2node-25gbe": MysteryCluster("a10-2node-25gbe", gpus_per_node=8, nodes=2, nics_per_node=1, nic_gbps=25,
                                      nic_pcie=(4, 16), **_A10),
    "h100-1node-25gbe": MysteryCluster("h100-1node-25gbe", gpus_per_node=8, nodes=1, nics_per_node=1,
                                       nic_gbps=25, nic_pcie=(4, 16), **_H100),
    "a100-1node-ndr": MysteryCluster("a100-1node-ndr", gpus_per_node=8, nodes=1, nics_per_node=8, nic_gbps=400,
                                     nic_pcie=(5, 16), **_A100),
}


def mystery_cluster(seed: int) -> MysteryCluster:
    """The SYNTHETIC cluster of ``seed`` (one of :data:`CLUSTERS`, with a seeded efficiency). Taught in lab 9."""
    seed = checks.count("seed", seed, at_least=0)
    rng = np.random.default_rng([9, seed])
    names = list(CLUSTERS)
    base = CLUSTERS[names[int(rng.integers(len(names)))]]
    return replace(base, efficiency=round(float(rng.uniform(0.80, 0.92)), 3), seed=seed)


@dataclass(frozen=True)
class Assignment:
    """What lab 9 gives the learner of ``seed``: a model, a held-out size, a SYNTHETIC cluster."""

    seed: int
    model: str
    held_out_bytes: int
    cluster: MysteryCluster


def assignment(seed: int) -> Assignment:
    """Lab 9's exercise for ``seed`` (deterministic). Taught in lab 9."""
    seed = checks.count("seed", seed, at_least=0)
    rng = np.random.default_rng([90, seed])
    return Assignment(seed, MODELS[int(rng.integers(len(MODELS)))], HELD_OUT[int(rng.integers(len(HELD_OUT)))],
                      mystery_cluster(seed))


def heldout_tolerance(fit_rel_errors, held_times_s, *, k: float = 3.0, floor: float = 0.25,
                      cap: float = 1.0) -> float:
    """The relative error a held-out prediction may have: ``k`` × the run's own noise, within [floor, cap].

    The noise is the larger of the fit's median |residual| on the sizes it was fitted to (model error plus
    timing noise, in the same run) and the held-out size's own spread, (p50 − p10)/p10 of its timings (how
    far its p10 can wander). ``cap`` = 1.0 keeps a unit slip (ms for s, ×1000) or a wrong formula (×2) failing
    however noisy the run. Taught in lab 9.
    """
    res = np.abs(np.asarray(fit_rel_errors, dtype=float))
    t = np.asarray(held_times_s, dtype=float)
    if res.size == 0 or not np.all(np.isfinite(res)):
        raise ValueError(f"fit_rel_errors must be finite numbers, got {fit_rel_errors!r:.80}")
    if t.size < 2 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError(f"held_times_s must hold at least 2 finite times > 0, got {held_times_s!r:.80}")
    k, floor, cap = checks.positive("k", k), checks.positive("floor", floor), checks.positive("cap", cap)
    if floor > cap:
        raise ValueError(f"floor={floor} is above cap={cap}")
    p10, p50 = np.percentile(t, 10), np.percentile(t, 50)
    noise = max(float(np.median(res)), float((p50 - p10) / p10))
    return float(min(cap, max(floor, k * noise))) if math.isfinite(noise) else cap
