"""Who set a step's pace, and why: the rules the cross-rank critical path (:mod:`labkit.trace.critical_path`)
applies at each step's collectives.

A rank holds the others back at a collective by **arriving last** (the others' median wait for it) or by
**leaving last** — an all-reduce's ranks end together once the last one arrived (AMD-AGI/TraceLens#22), so a
later end is a transfer of its own: a slow link (:func:`_holds`, :func:`_held`). The step's pacer is the rank
that held the others longest (:func:`_pacer`); its cause is where it exceeds the other ranks' median over the
stretch that made it late (:func:`_lateness`, :func:`_own_time`, :func:`_excess`).

The job's matrices (ranks × collectives) are files (:mod:`labkit.trace.ondisk`), read a column slab at a time
(:func:`_job_holds`; every rule is per collective, so the slab width changes no figure); each step's seconds per
rank (:class:`RankSeconds`) are a row of a :class:`RankStore`'s files. Times are µs in, seconds out (``US``).
Taught in chapter 9.
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


def _job_holds(A, X):
    """The last arrival ``L`` at each collective, who arrived last, and :func:`_holds` of the job's arrival and
    proven-end matrices (:class:`labkit.trace.ondisk.Matrix`, ranks × collectives), a column slab at a time:
    every figure is per collective, so it is the same whatever the slab width."""
    from labkit.trace import ondisk

    R, n = A.shape
    L, last, parts = np.empty(n), np.empty(n, dtype=np.intp), []
    for j0, j1, (a, x) in ondisk.column_slabs(A, X):
        L[j0:j1], last[j0:j1] = a.max(axis=0), a.argmax(axis=0)
        parts.append(_holds(a, x, L[j0:j1], last[j0:j1]))
        del a, x
    parts = parts or [_holds(np.empty((R, 0)), np.empty((R, 0)), L, last)]
    return L, last, tuple(np.concatenate([p[k] for p in parts]) for k in range(4))


class RankSeconds(Mapping):
    """Seconds per rank of one step (``StepPath.held_s``, ``waited_s``): a read-only mapping rank → float over
    one row of floats and the job's rank order, shared by every step. It reads, iterates and compares (``==``
    a dict) as the dict of the same items. The row is a float array, or (:meth:`on_disk`) a row of a
    :class:`RankStore`'s file, read each time it is asked for (the latest row of each file kept): the parent
    keeps two per step of every rank, so on disk they do not grow its memory with the rank count. Pickled, it
    is the array form. ``skip``: the index of the one rank left out (the pacer, in ``waited_s``), or -1.
    Taught in chapter 9."""

    __slots__ = ("_keys", "_pos", "_v", "_skip", "_src")

    def __init__(self, keys: tuple, pos: dict, values: np.ndarray, skip: int = -1):
        self._keys, self._pos, self._v, self._skip, self._src = keys, pos, values, skip, None

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

    @classmethod
    def on_disk(cls, d: dict, keys: tuple, pos: dict, store: RankStore, name: str, row: int):
        """:meth:`pack` of ``d``, its values written to row ``row`` of ``store``'s file ``name`` and read back
        from there; ``d`` itself where it does not pack."""
        rs = cls.pack(d, keys, pos)
        if not isinstance(rs, cls):
            return d
        store.write(name, row, rs._v)
        rs._v, rs._src = None, (store, name, row)
        return rs

    def _values(self) -> np.ndarray:
        return self._v if self._src is None else self._src[0].row(self._src[1], self._src[2])

    def __getitem__(self, r) -> float:
        i = self._pos.get(r)
        if i is None or i == self._skip:
            raise KeyError(r)
        return float(self._values()[i])

    def __iter__(self):
        return (r for i, r in enumerate(self._keys) if i != self._skip)

    def __len__(self) -> int:
        return len(self._keys) - (self._skip >= 0)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __reduce__(self):
        return type(self), (self._keys, self._pos, np.array(self._values()), self._skip)


class RankStore:
    """The files of a job's :class:`RankSeconds` rows (``names``: each a steps × ranks
    :class:`labkit.trace.ondisk.Matrix`) in a private folder that goes when the store does — every on-disk
    RankSeconds holds it, so a step's ``held_s`` outlives the result it came from. Taught in chapter 9."""

    __slots__ = ("folder", "_m", "_last", "__weakref__")

    def __init__(self, rows: int, cols: int, names=("held_s", "waited_s")):
        from labkit.trace.ondisk import Matrix, results_dir

        self.folder = results_dir(self)
        self._m = {n: Matrix(self.folder / f"{n}.f64", rows, cols) for n in names}
        self._last: dict[str, tuple[int, np.ndarray]] = {}

    def _file(self, name: str):
        if name not in self._m:
            raise ValueError(f"RankStore: name={name!r} is not one of its files {sorted(self._m)}")
        return self._m[name]

    def write(self, name: str, row: int, values) -> None:
        """Row ``row`` of file ``name`` from ``values`` (one a rank)."""
        self._file(name).write(row, values)
        self._last.pop(name, None)

    def row(self, name: str, row: int) -> np.ndarray:
        """Row ``row`` of file ``name`` (read-only; the latest row read of each file is kept)."""
        got = self._last.get(name)
        if got is None or got[0] != row:
            v = self._file(name).read(row, row + 1)[0]
            v.flags.writeable = False
            self._last[name] = got = (row, v)
        return got[1]


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


def _lateness(pi, in_step, ranks, col, L, last, hold):
    """The others' waits at the step's collectives the pacer reached last, the first of them (None if it reached
    none last, or alone) and, reaching none last, how it held the others instead: by leaving late, ``{"comm":
    by how much}`` (its step's sum; else ``{}``). The stretch that made the pacer late runs, on every rank, from the
    last arrival at the collective before the first one it reached last (from then on the ranks are in step:
    none can leave before it) to its arrival there — its transfer of that collective to its proven end
    (``comm``), then its own work (:func:`_own_time`). Later collectives inherit the lateness: the others
    computed their next gradients while they waited, so comparing those stretches would charge the pacer's
    inherited compute, whatever made it late. ``col(j)``: every rank's arrival at collective ``j``."""
    R = len(ranks)
    waited: dict[int, float] = {}
    reached_last = [j for j in in_step.tolist() if last[j] == pi]
    if R < 2:
        return waited, None, {}
    if not reached_last:
        late = sum(float(hold[3][j]) for j in in_step.tolist() if hold[2][j] == pi) * US
        return waited, None, ({"comm": late} if late > 0 else {})
    acc = np.zeros(R)
    for j in reached_last:                  # per rank, the same additions in the same order as one at a time
        acc += np.maximum(L[j] - col(j), 0.0) * US
    waited = {ranks[ri]: acc[ri] for ri in range(R) if ri != pi}
    return waited, reached_last[0], None


def _own_time(walked, ranks, index_of, cols, L, d0) -> np.ndarray:
    """Seconds per own cause (:data:`_OWN`, then ``comm``: the rank's transfer of the collective before, to its
    proven end ``X``) each rank spent in the stretch before each step's first collective its pacer reached last
    (steps × ranks × causes), rank by rank: one rank's index at a time, each stretch reduced to its sums as soon
    as it is classified. ``cols[k]``: every rank's arrival at step ``k``'s collective ``j`` (``walked[k][7]``)
    and proven end of collective ``j - 1`` (None where ``j`` is 0), or None where ``j`` is."""
    own = np.zeros((len(walked), len(ranks), len(_OWN) + 1))
    for ri, r in enumerate(ranks):
        if all(w[7] is None for w in walked):
            break
        index = index_of(r)
        for k, w in enumerate(walked):
            j = w[7]
            if j is None:
                continue
            aj, xp = cols[k]
            a = max(d0[ri], L[j - 1]) if j > 0 else d0[ri]
            b = min(max(a, xp[ri]), aj[ri]) if j > 0 else a
            own[k, ri, -1] = (b - a) * US
            for cause, (s, e) in index.classify(b, aj[ri]):
                if cause in _OWN:
                    own[k, ri, _OWN.index(cause)] += (e - s) * US
        del index
    return own


def _excess(pi, own) -> dict[str, float]:
    """The pacer's excess per own cause and ``comm`` over the median of the other ranks (``own``: ranks ×
    causes)."""
    others = np.median(np.delete(own, pi, axis=0), axis=0)
    return {c: float(own[pi, k] - others[k]) for k, c in enumerate((*_OWN, "comm"))}
