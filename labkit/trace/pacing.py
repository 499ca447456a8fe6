"""Who set a step's pace, and why: the rules the cross-rank critical path (:mod:`labkit.trace.critical_path`)
applies at each step's collectives.

A rank holds the others back at a collective by **arriving last** (the others' median wait for it) or by
**leaving last** — an all-reduce's ranks end together once the last one arrived (AMD-AGI/TraceLens#22), so a
later end is a transfer of its own: a slow link (:func:`_holds`, :func:`_held`). The step's pacer is the rank
that held the others longest (:func:`_pacer`); its cause is where it exceeds the other ranks' median over the
stretch that made it late (:func:`_lateness`, :func:`_own_time`, :func:`_excess`).

Times are µs in, seconds out (``US``). Taught in chapter 9.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from labkit.units import US

_OWN = ("compute", "data", "host", "idle")       # causes a rank can be slow by (not waiting, not transfer)


def _holds(A, E, L, last):
    """Per collective (µs): who arrived last, the others' median wait; who left last, how long after the next one."""
    R, n = A.shape
    if R < 2 or n == 0:
        return last, np.zeros(n), last, np.zeros(n)
    wait = np.array([np.median(np.delete(L[j] - A[:, j], last[j])) for j in range(n)])
    lf = E.argmax(axis=0)
    late = np.array([E[lf[j], j] - np.max(np.delete(E[:, j], lf[j])) for j in range(n)])   # after the runner-up
    return last, np.maximum(wait, 0.0), lf, np.maximum(late, 0.0)


class RankSeconds(Mapping):
    """Seconds per rank of one step (``StepPath.held_s``, ``waited_s``): a read-only mapping rank → float over
    one float array and the job's rank order, shared by every step. It reads, iterates and compares (``==``
    a dict) as the dict of the same items; it holds 8 bytes a rank where a dict held ~60 — the parent keeps
    two per step of every rank. ``skip``: the index of the one rank left out (the pacer, in ``waited_s``), or
    -1. Taught in chapter 9."""

    __slots__ = ("_keys", "_pos", "_v", "_skip")

    def __init__(self, keys: tuple, pos: dict, values: np.ndarray, skip: int = -1):
        self._keys, self._pos, self._v, self._skip = keys, pos, values, skip

    @classmethod
    def pack(cls, d: dict, keys: tuple, pos: dict):
        """``d`` as a :class:`RankSeconds` when its keys are ``keys`` in their order (all, or all but one);
        else ``d`` itself."""
        if len(d) == len(keys) and list(d) == list(keys):
            return cls(keys, pos, np.array(list(d.values()), dtype=float))
        if len(d) == len(keys) - 1 and d:
            out = [k for k in keys if k not in d]
            if len(out) == 1 and list(d) == [k for k in keys if k != out[0]]:
                skip = pos[out[0]]
                return cls(keys, pos, np.array([*list(d.values())[:skip], 0.0, *list(d.values())[skip:]]), skip)
        return d

    def __getitem__(self, r) -> float:
        i = self._pos.get(r)
        if i is None or i == self._skip:
            raise KeyError(r)
        return float(self._v[i])

    def __iter__(self):
        return (r for i, r in enumerate(self._keys) if i != self._skip)

    def __len__(self) -> int:
        return len(self._keys) - (self._skip >= 0)

    def __repr__(self) -> str:
        return repr(dict(self))


def _held(in_step, ranks, hold, keys=None):
    """Seconds each rank held the others back at the step's collectives: the others' median wait at those it
    reached last, plus how much later than the next rank it left those it left last (a :class:`RankSeconds`
    when ``keys``, the job's (ranks tuple, positions), is given; else a dict)."""
    held = dict.fromkeys(ranks, 0.0)
    last, wait, lf, late = hold
    for j in in_step.tolist():
        held[ranks[last[j]]] += float(wait[j]) * US
        held[ranks[lf[j]]] += float(late[j]) * US
    return held if keys is None else RankSeconds.pack(held, *keys)


def _pacer(held, by_rank, ranks) -> int:
    """The rank that held the others longest; else the one holding most of the path outside communication."""
    if max(held.values(), default=0.0) > 0:
        return max(held, key=held.get)
    non_comm = {r: sum(v for c, v in p.items() if c != "comm") for r, p in by_rank.items()}
    return max(non_comm, key=non_comm.get) if non_comm else ranks[0]


def _lateness(pi, in_step, ranks, A, L, last, hold):
    """The others' waits at the step's collectives the pacer reached last, the first of them (None if it reached
    none last, or alone) and, reaching none last, how it held the others instead: by leaving late, ``{"comm":
    by how much}`` (its step's sum; else ``{}``). The stretch that made the pacer late runs, on every rank, from the
    last arrival at the collective before the first one it reached last (from then on the ranks are in step:
    none can leave before it) to its arrival there — its transfer of that collective to its proven end
    (``comm``), then its own work (:func:`_own_time`). Later collectives inherit the lateness: the others
    computed their next gradients while they waited, so comparing those stretches would charge the pacer's
    inherited compute, whatever made it late."""
    R = len(ranks)
    waited: dict[int, float] = {}
    reached_last = [j for j in in_step.tolist() if last[j] == pi]
    if R < 2:
        return waited, None, {}
    if not reached_last:
        late = sum(float(hold[3][j]) for j in in_step.tolist() if hold[2][j] == pi) * US
        return waited, None, ({"comm": late} if late > 0 else {})
    for j in reached_last:
        for ri in range(R):
            if ri != pi:
                waited[ranks[ri]] = waited.get(ranks[ri], 0.0) + max(L[j] - A[ri, j], 0.0) * US
    return waited, reached_last[0], None


def _own_time(walked, ranks, index_of, A, X, L, d0) -> np.ndarray:
    """Seconds per own cause (:data:`_OWN`, then ``comm``: the rank's transfer of the collective before, to its
    proven end ``X``) each rank spent in the stretch before each step's first collective its pacer reached last
    (steps × ranks × causes), rank by rank: one rank's index at a time, each stretch reduced to its sums as soon
    as it is classified."""
    own = np.zeros((len(walked), len(ranks), len(_OWN) + 1))
    for ri, r in enumerate(ranks):
        if all(w[7] is None for w in walked):
            break
        index = index_of(r)
        for k, w in enumerate(walked):
            j = w[7]
            if j is None:
                continue
            a = max(d0[ri], L[j - 1]) if j > 0 else d0[ri]
            b = min(max(a, X[ri, j - 1]), A[ri, j]) if j > 0 else a
            own[k, ri, -1] = (b - a) * US
            for cause, (s, e) in index.classify(b, A[ri, j]):
                if cause in _OWN:
                    own[k, ri, _OWN.index(cause)] += (e - s) * US
        del index
    return own


def _excess(pi, own) -> dict[str, float]:
    """The pacer's excess per own cause and ``comm`` over the median of the other ranks (``own``: ranks ×
    causes)."""
    others = np.median(np.delete(own, pi, axis=0), axis=0)
    return {c: float(own[pi, k] - others[k]) for k, c in enumerate((*_OWN, "comm"))}
