"""A job's result tables kept on disk: written a piece at a time, read back a slab at a time, or whole on demand.

At job size the results of :func:`labkit.trace.analyze` and :func:`labkit.trace.critical_path` are themselves
ranks × steps (``step_breakdown``: 80 bytes a rank and step) and ranks × collectives (each rank's lateness, the
walk's arrival and end times): held in the analysing process they made its memory grow with the rank count,
1.29 MB a rank at 128 ranks × 6,326 steps (issue #35). Here they go to files, written with ``pwrite`` and read
with ``preadv`` into the caller's buffer. Nothing is memory-mapped: a file's pages sit in the kernel's page cache,
not in the process, so only the slab being worked on counts in its resident memory, whatever the rank count.

- :class:`Matrix` — a rows × cols array in one row-major file: filled a row (or part of one) at a time, read as a
  block of rows and columns (a column slab: every rank's values of a range of collectives).
- :class:`Slabs` — a matrix's columns, one at a time, read a column slab at a time (the latest two held): a
  pass that walks the columns forwards or backwards reads each slab once.
- :func:`median` — the exact median of values read in chunks, in memory bounded by ``budget`` elements
  (numpy's own ``np.median`` of the values, to the bit).
- :func:`pairwise_sum` — the sum of values read in ranges, equal to the bit to numpy's ``sum`` of them all.
- :class:`Lazy` — a table read from its files the first time it is asked for.
- :func:`results_dir` — the folder a result object's files live in: removed when the object is garbage
  collected, at process exit, or (a killed process's) by the next :func:`labkit.paths.sweep_scratch`.

Taught in chapter 9 (profiler traces: reading a real job's files).
"""
from __future__ import annotations

import contextlib
import os
import weakref
from pathlib import Path

import numpy as np

__all__ = ["Matrix", "column_slabs", "working_dir", "Slabs", "median", "pairwise_sum", "Lazy", "results_dir", "SLAB_BYTES"]

#: bytes a column slab may hold (the working set of a chunked pass over a ranks × collectives matrix)
SLAB_BYTES = 4 << 20


class Matrix:
    """A ``rows × cols`` array of ``dtype`` in the file ``path`` (created, private), row-major. Chapter 9."""

    def __init__(self, path, rows: int, cols: int, dtype=np.float64):
        self.path, self.shape, self.dtype = Path(path), (int(rows), int(cols)), np.dtype(dtype)
        if self.shape[0] < 0 or self.shape[1] < 0:
            raise ValueError(f"Matrix shape {self.shape} must not be negative")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._closer = weakref.finalize(self, os.close, self._fd)
        os.ftruncate(self._fd, self.shape[0] * self.shape[1] * self.dtype.itemsize)

    def _at(self, i: int, j: int) -> int:
        return (i * self.shape[1] + j) * self.dtype.itemsize

    def write(self, i: int, values, j0: int = 0) -> None:
        """Row ``i``'s columns ``j0 …`` from ``values`` (1-D)."""
        v = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1)
        if not (0 <= i < self.shape[0] and 0 <= j0 and j0 + len(v) <= self.shape[1]):
            raise IndexError(f"row {i}, columns {j0}:{j0 + len(v)} are outside the matrix {self.shape}")
        if len(v):
            os.pwrite(self._fd, memoryview(v).cast("B"), self._at(i, j0))

    def write_block(self, values, j0: int = 0, i0: int = 0) -> None:
        """Rows ``i0 …`` and columns ``j0 …`` from the 2-D ``values`` (one write per row)."""
        for k, row in enumerate(np.asarray(values)):
            self.write(i0 + k, row, j0)

    def read(self, i0: int = 0, i1: int | None = None, j0: int = 0, j1: int | None = None, out=None) -> np.ndarray:
        """Rows ``i0:i1`` × columns ``j0:j1`` (a new array, or ``out``'s first rows and columns)."""
        i1 = self.shape[0] if i1 is None else i1
        j1 = self.shape[1] if j1 is None else j1
        if not (0 <= i0 <= i1 <= self.shape[0] and 0 <= j0 <= j1 <= self.shape[1]):
            raise IndexError(f"rows {i0}:{i1}, columns {j0}:{j1} are outside the matrix {self.shape}")
        if out is None:
            out = np.empty((i1 - i0, j1 - j0), dtype=self.dtype)
        else:
            out = out[:i1 - i0, :j1 - j0]
        if j1 > j0:
            if j0 == 0 and j1 == self.shape[1] and out.flags.c_contiguous:      # whole rows: one read
                _read_into(self._fd, out, self._at(i0, 0))
            else:
                buf = np.empty(j1 - j0, dtype=self.dtype)
                for k in range(i1 - i0):
                    _read_into(self._fd, buf, self._at(i0 + k, j0))
                    out[k] = buf
        return out

    def slab_cols(self, rows: int | None = None) -> int:
        """How many columns of ``rows`` rows (all by default) fit in :data:`SLAB_BYTES` (at least 1)."""
        rows = self.shape[0] if rows is None else rows
        return max(1, SLAB_BYTES // max(1, rows * self.dtype.itemsize))

    def close(self) -> None:
        self._closer()

    def delete(self) -> None:
        """Close the file and remove it (a working matrix no result reads)."""
        self.close()
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def working_dir(folder, name: str):
    """A private folder for working files nothing reads afterwards: ``name`` made inside ``folder`` (the caller's
    scratch folder, which removes it), or with ``folder`` None a scratch folder of its own (``labkit-<name>-…``,
    :func:`labkit.paths.scratch`) removed when the block ends. Used by ``analyze`` and ``critical_path``. Chapter 9."""
    if folder is None:
        from labkit.paths import scratch

        with scratch(f"labkit-{name}-") as tmp:
            yield tmp
    else:
        p = Path(folder) / name
        p.mkdir(mode=0o700)
        yield p


def column_slabs(*matrices: Matrix, rows: int | None = None):
    """``(j0, j1, blocks)`` for each column slab of equally wide matrices (:class:`Matrix`): columns ``j0:j1`` of
    each one's first ``rows`` rows (all by default), as many columns as fit in :data:`SLAB_BYTES` for the
    largest of them. A pass over a job's matrices in bounded memory; per-collective figures computed a slab at a
    time are the same whatever the width. Chapter 9."""
    if not matrices or any(not isinstance(m, Matrix) for m in matrices):
        raise TypeError(f"column_slabs: give one or more labkit.trace.ondisk.Matrix, got "
                        f"{[type(m).__name__ for m in matrices]}")
    n = matrices[0].shape[1]
    if any(m.shape[1] != n for m in matrices):
        raise ValueError(f"column_slabs: the matrices' widths differ: {[m.shape for m in matrices]}")
    w = min(m.slab_cols(rows) for m in matrices)
    for j0 in range(0, n, w):
        j1 = min(n, j0 + w)
        yield j0, j1, [m.read(0, rows, j0, j1) for m in matrices]


class Slabs:
    """The columns of ``matrix`` (a :class:`Matrix`), read a column slab at a time: slabs of
    :meth:`Matrix.slab_cols` columns (all rows, ≤ :data:`SLAB_BYTES`) starting at multiples of that width,
    the ``keep`` latest held. Chapter 9."""

    def __init__(self, matrix: Matrix, keep: int = 2):
        if not isinstance(matrix, Matrix):
            raise TypeError(f"Slabs: matrix={str(matrix)[:60]!r} must be a labkit.trace.ondisk.Matrix, "
                            f"got {type(matrix).__name__}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"Slabs: keep={keep!r} must be an int >= 1 (how many slabs are held)")
        self.matrix, self.width, self.keep = matrix, matrix.slab_cols(), keep
        self._held: dict[int, np.ndarray] = {}        # slab number → its columns, least recently used first

    def slab(self, j: int) -> tuple[int, np.ndarray]:
        """(its first column, the slab) of the slab holding column ``j``."""
        if not 0 <= j < self.matrix.shape[1]:
            raise IndexError(f"column {j} is outside the matrix {self.matrix.shape}")
        k = j // self.width
        s = self._held.pop(k, None)
        if s is None:
            if len(self._held) >= self.keep:
                del self._held[next(iter(self._held))]
            s = self.matrix.read(j0=k * self.width, j1=min(self.matrix.shape[1], (k + 1) * self.width))
        self._held[k] = s
        return k * self.width, s

    def column(self, j: int) -> np.ndarray:
        """Column ``j`` (a view of its slab: copy it to keep it past the slab)."""
        j0, s = self.slab(j)
        return s[:, j - j0]

    def at(self, i: int, j: int):
        """The value at row ``i``, column ``j``."""
        j0, s = self.slab(j)
        return s[i, j - j0]


def _read_into(fd: int, arr: np.ndarray, offset: int) -> None:
    mv = memoryview(arr).cast("B")
    got = 0
    while got < len(mv):
        n = os.preadv(fd, [mv[got:]], offset + got)
        if n <= 0:
            raise OSError(f"short read of {len(mv)} bytes at offset {offset}: got {got}")
        got += n


def median(chunks, n: int, budget: int | None = None) -> float:
    """The median of ``n`` values that ``chunks()`` yields as 1-D float arrays (a fresh iterator per call: the
    values are read again on each pass), holding at most ``budget`` of them at once (default: a slab's worth). Equal to the bit to
    ``np.median`` of all of them: the one or two middle order statistics, found by narrowing a value range
    (pass: count the values below it, and bin those inside it) until the values inside fit in ``budget``.
    Chapter 9."""
    budget = max(1, SLAB_BYTES // 8) if budget is None else budget
    if n <= 0:
        return float("nan")
    ks = [(n - 1) // 2, n // 2]
    vals = [_select(chunks, n, k, budget) for k in sorted(set(ks))]
    lo, hi = vals[0], vals[-1]
    return float(np.mean(np.array([lo, hi]))) if ks[0] != ks[1] else float(lo)


def _select(chunks, n: int, k: int, budget: int) -> float:
    """The ``k``-th smallest (0-based) of the values, in bounded memory."""
    lo, hi = -np.inf, np.inf               # the answer is in [lo, hi]; `below`: values < lo
    below = 0
    while True:
        inside = 0
        for c in chunks():
            inside += int(np.count_nonzero((c >= lo) & (c <= hi)))
        if inside <= budget:
            got = np.concatenate([c[(c >= lo) & (c <= hi)] for c in chunks()] or [np.empty(0)])
            return float(np.partition(got, k - below)[k - below])
        if not (np.isfinite(lo) and np.isfinite(hi)):
            lo = min((float(c.min()) for c in chunks() if len(c)), default=0.0)
            hi = max((float(c.max()) for c in chunks() if len(c)), default=0.0)
            continue
        if lo == hi:
            return float(lo)
        edges = np.linspace(lo, hi, 4097)
        counts = np.zeros(4096, dtype=np.int64)
        for c in chunks():
            v = c[(c >= lo) & (c <= hi)]
            counts += np.histogram(v, bins=edges)[0]
        cum = below + np.cumsum(counts)
        b = int(np.searchsorted(cum, k, side="right"))
        new_lo, new_hi = float(edges[b]), float(edges[b + 1])
        below = int(cum[b - 1]) if b else below
        # np.histogram's last bin is closed, the others half-open: [new_lo, new_hi) except the last
        if b < 4095:
            new_hi = float(np.nextafter(new_hi, -np.inf))
        if new_lo >= new_hi or (new_lo, new_hi) == (lo, hi):      # one or two floats left: count them
            at_lo = sum(int(np.count_nonzero(c == new_lo)) for c in chunks())
            return new_lo if k - below < at_lo else float(np.nextafter(new_lo, np.inf))
        lo, hi = new_lo, new_hi


def pairwise_sum(read, n: int, budget: int | None = None) -> float:
    """``np.sum`` of ``n`` float64 values, equal to the bit, holding at most ``budget`` (≥ 128) at once: ``read(lo,
    hi)`` returns values ``lo:hi`` as a contiguous array. numpy sums a contiguous array pairwise: a range longer
    than 128 is split at its half rounded down to a multiple of 8 and the two halves' sums added (``pairwise_sum``
    in numpy's ``loops_utils.h.src``); a range of at most ``budget`` values is summed by numpy itself, which
    splits it the same way. Chapter 9."""
    budget = max(128, SLAB_BYTES // 8) if budget is None else budget
    if budget < 128:
        raise ValueError(f"budget={budget!r} must be at least 128 (numpy's pairwise block)")
    if n <= 0:
        return 0.0

    def rec(lo: int, m: int):
        if m <= budget:
            return read(lo, lo + m).sum()
        h = m // 2
        h -= h % 8
        return rec(lo, h) + rec(lo + h, m - h)

    return float(rec(0, n))


class Lazy:
    """A table read from disk by ``load()`` the first time :meth:`get` is called, then held. Chapter 9."""

    __slots__ = ("_load", "_value", "nbytes")

    def __init__(self, load, nbytes: int = 0):
        self._load, self._value, self.nbytes = load, None, int(nbytes)

    def get(self):
        if self._load is not None:
            self._value, self._load = self._load(), None
        return self._value

    @property
    def loaded(self) -> bool:
        return self._load is None

    def __repr__(self) -> str:
        return "<loaded table>" if self.loaded else f"<table on disk, {self.nbytes / 2**20:.1f} MB>"


def results_dir(owner, prefix: str = "labkit-results-") -> Path:
    """A private folder (:func:`labkit.paths.scratch_dir`) for ``owner``'s result files, removed with everything
    in it when ``owner`` is garbage collected or the process exits. Chapter 9."""
    from labkit.paths import remove_scratch, scratch_dir

    folder = scratch_dir(prefix)
    weakref.finalize(owner, remove_scratch, folder)
    return folder
