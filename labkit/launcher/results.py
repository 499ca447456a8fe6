"""What a launch hands back: each rank's :class:`RankResult`, the :class:`LaunchResult` of all ranks, and
the :class:`LaunchError` a failed, hung or unstartable launch raises.

Taught in chapter 5 (scaling: running N ranks) and chapter 19 (a failing DDP rank).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RankResult", "LaunchResult", "LaunchError"]


@dataclass
class RankResult:
    """What one rank left behind: return value, exit code, wall time and peak RSS (``wait4``).

    Taught in chapter 5 (scaling: running N ranks)."""

    rank: int
    exit_code: int | None
    wall_s: float
    peak_rss_bytes: int | None
    value: Any = None


@dataclass
class LaunchResult:
    """All ranks' results. ``.value`` is rank 0's return value, ``.values`` every rank's.

    Taught in chapter 5 (scaling: running N ranks)."""

    ranks: list[RankResult]
    log_dir: Path | None
    wall_s: float
    backend: str
    nprocs: int = field(init=False)

    def __post_init__(self):
        self.nprocs = len(self.ranks)

    @property
    def values(self) -> list[Any]:
        return [r.value for r in self.ranks]

    @property
    def value(self) -> Any:
        return self.ranks[0].value

    def log(self, rank: int = 0) -> str:
        """The full output of one rank (from its log file)."""
        if self.log_dir is None:
            raise ValueError("this launch kept no log files (log_dir=False)")
        return (Path(self.log_dir) / f"rank{rank}.log").read_text(errors="replace")

    def __repr__(self) -> str:
        rss = [f"{r.peak_rss_bytes / 2**20:.0f}" if r.peak_rss_bytes else "?" for r in self.ranks]
        return (f"LaunchResult({self.nprocs} ranks, backend={self.backend}, wall {self.wall_s:.1f} s, "
                f"exit codes {[r.exit_code for r in self.ranks]}, peak RSS MiB {rss}, "
                f"value={self.value!r:.80})")


class LaunchError(RuntimeError):
    """A rank failed, the launch timed out, or the ranks could not start.

    ``.rank`` is the failing (or, for a hang, the suspected) rank, ``.traceback`` its traceback text
    (or stack dump), ``.exit_code`` its exit code (negative: killed by that signal), ``.log_dir`` where
    the per-rank logs are, ``.timed_out`` whether the timeout fired.

    Taught in chapter 5 (scaling: running N ranks) and chapter 19 (a failing DDP rank).
    """

    def __init__(self, message: str, *, rank: int | None = None, traceback: str = "",
                 exit_code: int | None = None, log_dir: Path | None = None, timed_out: bool = False):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.exit_code = exit_code
        self.log_dir = log_dir
        self.timed_out = timed_out
