"""Lab 10's per-learner exercise: a published model, a global batch and a cluster to lay out.

``labkit.perf.exercise``. A seed picks, deterministically (NumPy's PCG64), one of :data:`SCENARIOS` — a
published model shape (:func:`labkit.flops.preset`), a sequence length, a global batch (the scenario's, or
twice it) and a cluster preset of :mod:`labkit.perf.layout` with a node count. Every scenario spans at least
two nodes, so a TP group can be kept inside a node or spread across the network, and every one has layouts
that fit 90 % of a GPU's memory.

What the seed does **not** give is the answer: the assignment holds the problem only (no layout, no
prediction, no ranking). The learner runs :func:`labkit.perf.plan` on it, picks a layout, and the hidden
checks rerun :func:`labkit.perf.predict` on the layout the learner recorded (:func:`layout_from`), in the
grader's process.

Taught in lab 10 (``labs/lab10_planner``), on chapter 24 (choosing a parallel layout).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from labkit import checks
from labkit.perf.layout import Cluster, Layout, cluster

__all__ = ["SCENARIOS", "Assignment", "Scenario", "assignment", "layout_dict", "layout_from"]


@dataclass(frozen=True)
class Scenario:
    """A model (preset name), its sequence length, a global batch (sequences) and a cluster preset × nodes."""

    model: str
    seq_len: int
    global_batch: int
    cluster: str
    nodes: int


#: The problems lab 10 hands out. The clusters are :data:`labkit.perf.CLUSTERS`' cited presets (a100-25gbe: the
#: slow-network case of chapter 24); the shapes are published (``labkit.flops.preset``).
SCENARIOS = (
    Scenario("llama3-70b", 4096, 512, "a100-25gbe", 8),
    Scenario("llama3-70b", 4096, 512, "dgx-a100", 8),
    Scenario("llama3-70b", 4096, 512, "dgx-h100", 8),
    Scenario("llama3-8b", 8192, 256, "a100-25gbe", 4),
    Scenario("llama3-8b", 8192, 128, "dgx-a100", 2),
    Scenario("gpt3-175b", 2048, 512, "dgx-h100", 8),
    Scenario("gpt3-175b", 2048, 768, "dgx-a100", 16),
)


@dataclass(frozen=True)
class Assignment:
    """What lab 10 gives the learner of ``seed``: the model, its sequence length, the global batch, the cluster."""

    seed: int
    model: str
    seq_len: int
    global_batch: int
    cluster_name: str
    nodes: int

    @property
    def cluster(self) -> Cluster:
        """The :class:`~labkit.perf.Cluster` to lay the model out on (the preset with ``nodes`` nodes)."""
        return cluster(self.cluster_name, nodes=self.nodes)

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.model} at {self.seq_len:,} tokens per sequence, global batch "
                f"{self.global_batch} sequences, on {self.cluster.describe()}")


def assignment(seed: int) -> Assignment:
    """Lab 10's problem for ``seed`` (deterministic): one of :data:`SCENARIOS`, its batch ×1 or ×2.
    Taught in lab 10."""
    seed = checks.count("seed", seed, at_least=0)
    rng = np.random.default_rng([10, seed])
    s = SCENARIOS[int(rng.integers(len(SCENARIOS)))]
    scale = int(rng.integers(1, 3))
    return Assignment(seed, s.model, s.seq_len, s.global_batch * scale, s.cluster, s.nodes)


_LAYOUT_KEYS = tuple(f.name for f in fields(Layout))


def layout_dict(layout: Layout) -> dict:
    """A :class:`~labkit.perf.Layout` as plain JSON types (what lab 10 records). Taught in lab 10."""
    if not isinstance(layout, Layout):
        raise checks.ArgumentTypeError(f"layout must be a labkit.perf.Layout, got {type(layout).__name__} "
                                       f"{layout!r:.60}")
    return asdict(layout)


def layout_from(d) -> Layout:
    """The :class:`~labkit.perf.Layout` of a recorded dict (every field of :func:`layout_dict`, no other).
    Taught in lab 10."""
    if not isinstance(d, dict):
        raise checks.ArgumentTypeError(f"a recorded layout must be a dict of Layout's fields, got "
                                       f"{type(d).__name__} {d!r:.60}")
    missing, extra = sorted(set(_LAYOUT_KEYS) - set(d)), sorted(set(d) - set(_LAYOUT_KEYS))
    if missing or extra:
        raise ValueError(f"a recorded layout must hold exactly Layout's fields {list(_LAYOUT_KEYS)}; "
                         f"missing {missing}, unknown {extra}")
    return Layout(**d)
