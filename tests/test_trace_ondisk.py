"""labkit.trace.ondisk: result tables on disk (issue #35) — exact median in bounded memory, matrices read back."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from labkit.trace import ondisk


@pytest.mark.parametrize("kind", ["normal", "ties", "wide", "two_floats"])
def test_median_equals_numpy_in_any_budget(kind):
    rng = np.random.default_rng(len(kind))
    for _ in range(40):
        n = int(rng.integers(1, 3000))
        x = {"normal": lambda n: rng.normal(size=n), "ties": lambda n: rng.integers(0, 4, size=n).astype(float),
             "wide": lambda n: np.exp(rng.normal(size=n) * 30),
             "two_floats": lambda n: np.where(rng.random(n) < 0.4, 3.25, np.nextafter(3.25, 9.0))}[kind](n)
        parts = np.array_split(x, int(rng.integers(1, 9)))
        got = ondisk.median(lambda parts=parts: iter(parts), n, budget=int(rng.integers(1, 40)))
        assert got == np.median(x)


def test_median_of_nothing_is_nan():
    assert np.isnan(ondisk.median(lambda: iter([]), 0))


def test_matrix_round_trip_and_slabs(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.normal(size=(6, 9))
    m = ondisk.Matrix(tmp_path / "m", 6, 9)
    for i in range(6):
        m.write(i, a[i, 4:], 4)
        m.write(i, a[i, :4])
    assert (m.read() == a).all()
    assert (m.read(2, 5, 3, 8) == a[2:5, 3:8]).all()
    m.write_block(a[:, 1:3] * 2, 1)
    a[:, 1:3] *= 2
    out = np.empty((6, 9))
    assert (m.read(out=out) == a).all()
    assert m.slab_cols() == ondisk.SLAB_BYTES // (6 * 8)
    with pytest.raises(IndexError, match="outside the matrix"):
        m.write(6, [1.0])
    with pytest.raises(IndexError, match="outside the matrix"):
        m.read(0, 7)
    ints = ondisk.Matrix(tmp_path / "i", 2, 3, dtype=np.int64)
    ints.write(1, [7, 8, 9])
    assert ints.read(1, 2).tolist() == [[7, 8, 9]]
    ints.delete()
    assert not (tmp_path / "i").exists()


def test_results_dir_goes_with_its_owner():
    class Owner:
        pass

    o = Owner()
    folder = ondisk.results_dir(o)
    (folder / "x").write_bytes(b"1")
    assert folder.is_dir()
    del o
    gc.collect()
    assert not folder.exists()


def test_lazy_loads_once():
    calls = []
    lz = ondisk.Lazy(lambda: calls.append(1) or "table", nbytes=2 << 20)
    assert "2.0 MB" in repr(lz) and not lz.loaded
    assert lz.get() == "table" and lz.get() == "table" and calls == [1] and lz.loaded


def test_pairwise_sum_equals_numpy_to_the_bit():
    rng = np.random.default_rng(2)
    for n in (1, 7, 129, 1000, 12_345, 300_001):
        x = np.exp(rng.normal(size=n) * 6)
        for budget in (128, 200, 4096):
            assert ondisk.pairwise_sum(lambda lo, hi, x=x: x[lo:hi], n, budget) == x.sum()
    assert ondisk.pairwise_sum(lambda lo, hi: np.empty(0), 0) == 0.0
    with pytest.raises(ValueError, match="at least 128"):
        ondisk.pairwise_sum(lambda lo, hi: np.empty(0), 5, budget=64)


def test_slabs_read_each_slab_once_walking_either_way(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, 11))
    m = ondisk.Matrix(tmp_path / "m", 3, 11)
    m.write_block(a)
    monkeypatch.setattr(ondisk, "SLAB_BYTES", 3 * 8 * 4)           # slabs of 4 columns: 0-3, 4-7, 8-10
    reads = []
    real = m.read
    monkeypatch.setattr(m, "read", lambda *a, **k: reads.append(k) or real(*a, **k))
    s = ondisk.Slabs(m)
    assert s.width == 4
    for j in [*range(11), *range(10, -1, -1)]:
        assert (s.column(j) == a[:, j]).all() and s.at(j % 3, j) == a[j % 3, j]
    assert [(r["j0"], r["j1"]) for r in reads] == [(0, 4), (4, 8), (8, 11), (0, 4)]   # 8-11, 4-8 still held
    assert s.slab(9)[0] == 8
    with pytest.raises(IndexError, match="column 11 is outside"):
        s.column(11)
    with pytest.raises(TypeError, match="must be a labkit.trace.ondisk.Matrix"):
        ondisk.Slabs(a)
    with pytest.raises(ValueError, match="keep=0"):
        ondisk.Slabs(m, keep=0)


def test_column_slabs_cover_every_column_once_in_bounded_slabs(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(5, 23)), rng.normal(size=(5, 23))
    ma, mb = ondisk.Matrix(tmp_path / "a", 5, 23), ondisk.Matrix(tmp_path / "b", 5, 23)
    for i in range(5):
        ma.write(i, a[i])
        mb.write(i, b[i])
    monkeypatch.setattr(ondisk, "SLAB_BYTES", 5 * 8 * 4)              # 4 columns of 5 rows
    got = list(ondisk.column_slabs(ma, mb))
    assert [(j0, j1) for j0, j1, _ in got] == [(j, min(23, j + 4)) for j in range(0, 23, 4)]
    assert (np.hstack([x for _, _, (x, _) in got]) == a).all() and (np.hstack([y for _, _, (_, y) in got]) == b).all()
    ones = list(ondisk.column_slabs(ma, rows=1))                       # one row: 20 columns a slab
    assert [j1 - j0 for j0, j1, _ in ones] == [20, 3] and (np.hstack([x for _, _, (x,) in ones]) == a[:1]).all()
    assert list(ondisk.column_slabs(ondisk.Matrix(tmp_path / "e", 5, 0))) == []
    with pytest.raises(ValueError, match="widths differ"):
        list(ondisk.column_slabs(ma, ondisk.Matrix(tmp_path / "c", 5, 22)))
    with pytest.raises(TypeError, match="Matrix"):
        list(ondisk.column_slabs(a))


def test_working_dir_inside_a_folder_or_a_scratch_of_its_own(tmp_path):
    with ondisk.working_dir(tmp_path, "work") as w:
        assert w == tmp_path / "work" and w.is_dir() and (w.stat().st_mode & 0o777) == 0o700
    assert w.is_dir()                                             # the caller's folder removes it
    with ondisk.working_dir(None, "work") as s:
        assert s.is_dir() and s.name.startswith("labkit-work-")
        (s / "f").write_text("x")
    assert not s.exists()
    with pytest.raises(FileExistsError):                          # never into a folder that is there
        with ondisk.working_dir(tmp_path, "work"):
            pass
