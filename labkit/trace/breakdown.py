"""Per-rank, per-step time breakdown of a profiler trace (labkit's definitions).

Definitions (chapter 9). Every step window is split into a partition

    total = compute + comm_exposed + memcpy + idle_host_wait + idle_other

**GPU traces** (the device timeline is the kernels: ``kernel``, ``gpu_memcpy``, ``gpu_memset``):

- *compute*: union of kernels that are neither communication nor memory copies/sets;
- *communication*: union of NCCL/RCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``,
  ``ncclAllReduceRingLLKernel…``, ``rccl…``); *hidden* = the part under compute, *exposed* = the rest;
- *memcpy*: memory copies/sets not under compute or communication;
- *idle*: no kernel running; *host wait* is the part of an idle gap before the host had launched the
  next kernel (its ``cudaLaunchKernel`` — same ``correlation`` — starts after the gap began: the
  device waited on the host), *other* the rest (waits on events, other ranks, synchronisation).
- step windows follow the device: step *i* runs from the first kernel launched inside
  ``ProfilerStep#i`` to the first kernel launched in the next step (the last step ends with its
  last kernel). Without ``ProfilerStep`` the window is the whole device timeline.

**CPU traces** (no device; the compute "device" is the main thread — the one holding
``ProfilerStep``, else the one with most ``cpu_op`` time):

- *communication*: union of gloo's ``gloo:*`` ``user_annotation`` spans on the ``pt_gloo_runloop``
  threads (they carry the real duration; the ``c10d::*`` ``cpu_op`` on the main thread is only the launch),
  each cut at the first *sync point* after its start. gloo closes its span only after it has completed the
  work's future (``finishWorkGloo``: ``markCompleted``, then ``finish`` ends the range), so the waiting
  main thread can resume while the span is still open — by milliseconds when the gloo thread loses its
  core. The trace proves completion at two sync points on the main thread: the start of DDP's last
  ``torch.distributed.ddp.reducer::copy_bucket_to_grad`` of a backward (the reducer copies a bucket into
  ``.grad`` only after its all-reduce completed, buckets in launch order) and the start of an
  ``Optimizer.step#…`` range (gradients are final). Collectives still in flight across an optimizer step
  (rare: an async metric reduction) would be cut too;
- *compute*: union of the main thread's ``cpu_op`` spans (forward, ``autograd::engine::evaluate_function:
  …Backward`` ops, optimizer), minus the spans of the collective ops themselves — launches (``c10d::*``,
  ``_c10d_functional::*``, ``record_param_comms``) and recorded waits (``…::wait``, ``…::wait_tensor``) —
  minus the data loader. A main thread blocked on a collective is not computing: DDP's wait for its last
  buckets (``finalize_backward``) and ``Work.wait()`` record no op in current PyTorch, so they are gaps
  in the main thread's ops; where a wait op is recorded, its span is cut out of any op that contains it;
- *hidden* communication = communication ∩ compute (a gloo thread reduces a bucket while the main thread
  runs backward), *exposed* = communication − compute (it runs while the main thread waits or idles);
- *memcpy*: 0 (no device copies);
- *idle host wait*: inside ``DataLoader`` ``__next__`` spans (the compute thread waits on input),
  *idle other*: everything else (Python between ops, sleeps, waits with no collective running).
- step windows are the ``ProfilerStep#N`` ranges, else the main thread's extent.

The convention is the GPU one: the partition counts wall time once. A stretch where the main thread
computes while a gloo thread communicates is *compute* in the partition and also *comm_hidden* (which
is not a share of the step — it is the part of the communication that cost no wall time); *overlap* =
hidden ÷ (hidden + exposed). Caveat: threads are not a second device. On a machine whose cores are all
busy (2 cores shared by 2 ranks, each a main thread plus gloo threads) "hidden" gloo work still competes
with backward for the same cores and slows it down: overlap here says the two ran at the same time,
not that the communication was free — the compute spans grow by what it took.

*Data wait* (both kinds) is the device idle caused by the data loader: each idle gap that a
``DataLoader`` ``__next__`` span overlaps counts from where the span (or the gap) starts to the end of
the gap — the wait itself and the idle that follows it until the device has work again.

Taught in chapter 9 (profiler traces).
"""
from __future__ import annotations

import numpy as np

import labkit.intervals as iv
from labkit.trace.load import (
    COMM_KERNEL_RE,
    CPU_OP,
    DEVICE_CATS,
    KERNEL,
    MEMCPY,
    MEMSET,
    RUNTIME,
    USER_ANNOTATION,
    RankEvents,
)
from labkit.units import US

_MEM_NAMES = ("Memcpy", "Memset", "dma")
_DTYPE_BYTES = {"float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4, "double": 8, "float64": 8,
                "long": 8, "int64": 8, "uint64": 8, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2,
                "int16": 2, "short": 2, "char": 1, "byte": 1, "int8": 1, "uint8": 1, "bool": 1,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "int8_t": 1, "uint8_t": 1}
_COLL_WORDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
               ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("broadcast", "broadcast"),
               ("reduce", "reduce"), ("send", "send"), ("recv", "recv"), ("barrier", "barrier"),
               ("gather", "gather"), ("scatter", "scatter"))
_COLL_OP_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
_WAIT_SUFFIXES = ("::wait", "::wait_tensor")
_DDP_COPY = "torch.distributed.ddp.reducer::copy_bucket_to_grad"
_AUTOGRAD = "autograd::engine::evaluate_function"
COLUMNS = ("compute", "comm_exposed", "comm_hidden", "memcpy", "idle_host_wait", "idle_other", "total",
           "data_wait")


def collective_type(name: str) -> str:
    """Collective of a kernel/span name or a ``Collective name`` arg: ``ncclDevKernel_AllGather_RING_LL``
    → ``all_gather``; ``gloo:all_reduce`` → ``all_reduce``; ``allreduce`` → ``all_reduce``.

    Taught in chapter 9.
    """
    key = name.split(":", 1)[1] if name.startswith("gloo:") else name
    key = key.lower().replace("_", "").replace("nccl", "").replace("rccl", "")
    for word, canon in _COLL_WORDS:
        if word in key:
            return canon
    return "other"


def is_collective_op(name: str) -> bool:
    """Whether a CPU op name is a collective's launch or a wait on one (not compute on a CPU trace):
    ``c10d::allreduce_``, ``_c10d_functional::wait_tensor``, ``record_param_comms``, ``…::wait``.

    Taught in chapter 9.
    """
    return name.startswith(_COLL_OP_PREFIXES) or name == "record_param_comms" or name.endswith(_WAIT_SUFFIXES)


def sync_points(ev: RankEvents, main_thread: int) -> np.ndarray:
    """Sorted times (µs) on a CPU trace's main thread by which every collective started earlier has
    completed for this rank: the start of DDP's last ``copy_bucket_to_grad`` op of each backward (copies
    not separated by an ``autograd::engine`` op belong to one backward) and the start of every
    ``Optimizer.step#…`` range.

    Taught in chapter 9.
    """
    main = ev.thread == main_thread
    copies = np.sort(ev.ts[main & (ev.cat == CPU_OP) & ev.name_mask(lambda n: n == _DDP_COPY)])
    backward = np.sort(ev.ts[main & (ev.cat == CPU_OP) & ev.name_mask(lambda n: n.startswith(_AUTOGRAD))])
    if copies.size:
        seen = np.searchsorted(backward, copies, side="right")     # backward ops started by each copy
        copies = copies[np.append(seen[1:] != seen[:-1], True)]    # the last copy before the next backward
    opt = ev.ts[main & (ev.cat == USER_ANNOTATION) & ev.name_mask(lambda n: n.startswith("Optimizer.step#"))]
    return np.unique(np.concatenate([copies, opt]))


def dtype_bytes(dtype) -> int | None:
    """Bytes per element of a trace ``dtype`` arg (``Float`` → 4, ``BFloat16`` → 2); None if unknown.

    Taught in chapter 9.
    """
    if dtype is None:
        return None
    return _DTYPE_BYTES.get(str(dtype).lower().replace("torch.", ""))


class RankView:
    """Classified event sets of one rank, ready to be cut into step windows.

    Taught in chapter 9.
    """

    def __init__(self, ev: RankEvents):
        self.ev = ev
        self.kind = "gpu" if ev.has_device else "cpu"
        cat, names = ev.cat, ev.names
        end = ev.end
        self.main_thread = self._main_thread()
        on_main = ev.thread == self.main_thread
        dl = (cat == USER_ANNOTATION) & ev.name_mask(lambda n: "DataLoader" in n) & on_main
        self.dataloader = iv.union(ev.ts[dl], end[dl])
        step_mask = (cat == USER_ANNOTATION) & ev.name_mask(lambda n: n.startswith("ProfilerStep#")) & on_main
        idx = np.flatnonzero(step_mask)
        nums = np.array([_step_number(ev, names[ev.name_id[i]]) for i in idx], dtype=int)
        order = np.argsort(ev.ts[idx])
        self.step_ids = nums[order]
        self.step_host = np.stack([ev.ts[idx][order], end[idx][order]], axis=1) if idx.size else np.zeros((0, 2))
        if self.kind == "gpu":
            dev = np.isin(cat, DEVICE_CATS)
            comm = (cat == KERNEL) & ev.name_mask(lambda n: bool(COMM_KERNEL_RE.match(n)))
            mem = ((cat == MEMCPY) | (cat == MEMSET)
                   | ((cat == KERNEL) & ev.name_mask(lambda n: n.startswith(_MEM_NAMES))))
            comp = (cat == KERNEL) & ~comm & ~mem
            self.comm_idx = np.flatnonzero(comm)
            self.dev_idx = np.flatnonzero(dev)
            self.comp_idx = np.flatnonzero(comp)
            self.mem_idx = np.flatnonzero(mem)
            # launch time of every device event via its correlation id
            rt = np.flatnonzero(cat == RUNTIME)
            rt_corr, rt_ts = ev.corr[rt], ev.ts[rt]
            o = np.argsort(rt_corr)
            rt_corr, rt_ts = rt_corr[o], rt_ts[o]
            self.launch_ts = np.full(ev.ts.size, np.nan)
            if rt_corr.size:
                dc = ev.corr[self.dev_idx]
                pos = np.clip(np.searchsorted(rt_corr, dc), 0, rt_corr.size - 1)
                hit = rt_corr[pos] == dc
                self.launch_ts[self.dev_idx[hit]] = rt_ts[pos[hit]]
        else:
            comm = (cat == USER_ANNOTATION) & ev.name_mask(lambda n: n.startswith("gloo:"))
            ops = (cat == CPU_OP) & on_main
            coll = ops & ev.name_mask(is_collective_op)
            comp = ops & ~coll
            self.comm_idx = np.flatnonzero(comm)
            self.comp_idx = np.flatnonzero(comp)
            not_compute = iv.union(np.concatenate([ev.ts[coll], self.dataloader[0]]),
                                   np.concatenate([end[coll], self.dataloader[1]]))
            self.dev_idx = np.flatnonzero(comm | comp)
            self.mem_idx = np.zeros(0, dtype=int)
            self.launch_ts = None
        self.comm_idx = self.comm_idx[np.argsort(ev.ts[self.comm_idx], kind="stable")]
        self._comp_u = iv.union(ev.ts[self.comp_idx], end[self.comp_idx])
        comm_end = end[self.comm_idx]
        if self.kind == "cpu":       # a gloo span ends no later than the next sync point (module docstring)
            marks = sync_points(ev, self.main_thread)
            k = np.searchsorted(marks, ev.ts[self.comm_idx], side="right")
            cut = np.append(marks, np.inf)[k]
            comm_end = np.minimum(comm_end, cut)
        self._comm_end = comm_end            # per comm_idx: the span's end, cut at the sync point (CPU)
        self._comm_u = iv.union(ev.ts[self.comm_idx], comm_end)
        self._mem_u = iv.union(ev.ts[self.mem_idx], end[self.mem_idx])
        if self.kind == "cpu":      # the main thread's ops minus collective launches/waits and the loader
            self._comp_u = iv.subtract(self._comp_u, not_compute)
        self._dev_order = self._dev_starts = self._dev_launch = self._comp_cum = None

    def _main_thread(self) -> int:
        ev = self.ev
        steps = (ev.cat == USER_ANNOTATION) & ev.name_mask(lambda n: n.startswith("ProfilerStep#"))
        if steps.any():
            return int(np.bincount(ev.thread[steps]).argmax())
        cpu = ev.cat == CPU_OP
        if not cpu.any():
            return -1
        return int(np.bincount(ev.thread[cpu], weights=ev.dur[cpu]).argmax())

    # ------------------------------------------------------------------ windows
    def windows(self, steps=None) -> list[tuple[int, float, float, float, float]]:
        """(step id, device start, device end, host start, host end) per selected step.

        Linear in events: each device event is assigned to the step whose host range holds its launch
        by one sorted search (the steps of one main thread do not overlap), then per-step minima and
        maxima by one grouped reduction."""
        ev = self.ev
        unlinked = self.kind == "gpu" and bool(np.isnan(self.launch_ts[self.dev_idx]).all())
        if self.step_ids.size == 0 or unlinked:       # no steps, or kernels not linked to launches
            if self.dev_idx.size == 0:
                return []
            d0, d1 = ev.ts[self.dev_idx].min(), ev.end[self.dev_idx].max()
            if self.kind == "gpu":
                host = ev.cat != KERNEL
                h0, h1 = ev.ts[host].min(), ev.end[host].max()
            else:
                h0, h1 = d0, d1
            return [(-1, d0, d1, h0, h1)]
        n = len(self.step_ids)
        keep = np.ones(n, dtype=bool) if steps is None else \
            np.array([sid in steps for sid in self.step_ids.tolist()], dtype=bool)
        hs, he = self.step_host[:, 0], self.step_host[:, 1]
        if self.kind == "cpu":
            return [(int(self.step_ids[i]), hs[i], he[i], hs[i], he[i]) for i in np.flatnonzero(keep).tolist()]
        lt = self.launch_ts[self.dev_idx]
        if n > 1 and bool(np.any(hs[1:] < he[:-1])):       # overlapping step ranges: one step at a time
            owner = None
        else:
            k = np.searchsorted(hs, lt, side="right") - 1
            ok = (k >= 0) & (lt < he[np.clip(k, 0, n - 1)])   # NaN launches fail the comparison
            owner = np.where(ok, k, -1)
        first = np.full(n, np.inf)
        last_end = np.full(n, -np.inf)
        if owner is not None:
            sel = owner >= 0
            np.minimum.at(first, owner[sel], ev.ts[self.dev_idx[sel]])
            np.maximum.at(last_end, owner[sel], ev.end[self.dev_idx[sel]])
        else:
            for i in range(n):
                m = (lt >= hs[i]) & (lt < he[i])
                if m.any():
                    first[i] = ev.ts[self.dev_idx[m]].min()
                    last_end[i] = ev.end[self.dev_idx[m]].max()
        out = []
        for i in np.flatnonzero(keep & np.isfinite(first)).tolist():
            d0 = first[i]
            if i + 1 < n:
                d1 = first[i + 1] if np.isfinite(first[i + 1]) else last_end[i]
            else:
                d1 = last_end[i]
            out.append((int(self.step_ids[i]), d0, d1, hs[i], he[i]))
        return out

    # ------------------------------------------------------------------ breakdown
    def breakdown(self, w) -> dict:
        """Seconds in each part of the partition for one window (see the module docstring)."""
        sid, d0, d1, h0, h1 = w
        comp = _clip(self._comp_u, d0, d1)
        comm = _clip(self._comm_u, d0, d1)
        mem = _clip(self._mem_u, d0, d1)
        compute = iv.total(comp)
        comm_t = iv.total(comm)
        hidden = iv.intersect_total(comm, comp)
        mem_only = iv.subtract(iv.subtract(mem, comp), comm)
        busy = iv.union(np.concatenate([comp[0], comm[0], mem_only[0]]),
                        np.concatenate([comp[1], comm[1], mem_only[1]]))
        total = d1 - d0
        idle = max(total - iv.total(busy), 0.0)
        gaps = _gaps(busy, d0, d1)
        dl = _clip(self.dataloader, d0, d1)
        data_idle = _data_idle(gaps, dl)
        if self.kind == "cpu":
            host_wait = iv.intersect_total(gaps, dl)
        else:
            host_wait = self._host_wait(gaps)
        host_wait = min(host_wait, idle)
        us = US
        return {"step": sid, "compute": compute * us, "comm_exposed": (comm_t - hidden) * us,
                "comm_hidden": hidden * us, "memcpy": iv.total(mem_only) * us, "idle_host_wait": host_wait * us,
                "idle_other": (idle - host_wait) * us, "total": total * us, "data_wait": data_idle * us}

    def _host_wait(self, gaps) -> float:
        """Part of each idle gap before the next device event had been launched by the host."""
        ev = self.ev
        if gaps[0].size == 0:
            return 0.0
        if self._dev_order is None:                    # sorted once, searched per window
            self._dev_order = self.dev_idx[np.argsort(ev.ts[self.dev_idx], kind="stable")]
            self._dev_starts = ev.ts[self._dev_order]
            self._dev_launch = self.launch_ts[self._dev_order]
        return host_wait(self._dev_starts, self._dev_launch, gaps)

    # ------------------------------------------------------------------ collectives
    def collectives(self, windows) -> list[dict]:
        """Collectives inside the windows, in time order: type, start, duration, bytes (when known) and
        ``end_us``: when the rank is known to have left it (on CPU the span cut at the next sync point)."""
        ev = self.ev
        span_s, span_e = iv.union([w[1] for w in windows], [w[2] for w in windows])
        out = []
        rpc = sorted((i for i in ev.comm_args if ev.cat[i] == CPU_OP), key=lambda i: ev.ts[i])
        rpc_ts = np.array([ev.ts[i] for i in rpc]) if rpc else np.zeros(0)
        t_all = ev.ts[self.comm_idx]
        j = np.searchsorted(span_s, t_all, side="right") - 1     # the merged window that may hold it
        inside = (j >= 0) & (t_all < span_e[np.clip(j, 0, max(span_e.size - 1, 0))]) if span_s.size \
            else np.zeros(t_all.size, dtype=bool)
        for k, i in enumerate(self.comm_idx.tolist()):
            if not inside[k]:
                continue
            t0 = ev.ts[i]
            name = ev.names[ev.name_id[i]]
            args = ev.comm_args.get(i)
            if not (args and "In msg nelems" in args) and rpc:
                args = self._param_comms(i, k, rpc, rpc_ts)
            ctype = collective_type(str(args.get("Collective name"))) if args and args.get("Collective name") \
                else collective_type(name)
            nbytes = None
            if args and args.get("In msg nelems") is not None:
                size = dtype_bytes(args.get("dtype"))
                if size:
                    nelems = max(int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0))
                    nbytes = nelems * size
            out.append({"type": ctype, "name": name, "start_us": float(t0), "dur_us": float(ev.dur[i]),
                        "bytes": nbytes, "end_us": float(self._comm_end[k])})
        return out

    def _param_comms(self, i, k, rpc, rpc_ts):
        """The ``record_param_comms`` op that launched comm event ``i`` (GPU: contains its launch;
        CPU: the k-th one, when counts agree)."""
        ev = self.ev
        if self.kind == "gpu":
            lt = self.launch_ts[i]
            if lt != lt:
                return None
            j = np.searchsorted(rpc_ts, lt, side="right") - 1
            if j >= 0 and lt <= ev.ts[rpc[j]] + ev.dur[rpc[j]]:
                return ev.comm_args[rpc[j]]
            return None
        if len(rpc) == self.comm_idx.size:
            return ev.comm_args[rpc[k]]
        return None

    def compute_between(self, t0, t1) -> float:
        """Compute seconds in [t0, t1) (two sorted searches on the merged compute set: O(log n))."""
        return max(self._covered(t1) - self._covered(t0), 0.0) * US

    def _covered(self, t: float) -> float:
        """Merged compute time (µs) before ``t``: prefix sums of the merged set, built once."""
        s, e = self._comp_u
        if s.size == 0:
            return 0.0
        if self._comp_cum is None:
            self._comp_cum = np.concatenate([[0.0], np.cumsum(e - s)])
        j = int(np.searchsorted(s, t, side="right"))
        if j == 0:
            return 0.0
        return float(self._comp_cum[j - 1] + min(t, e[j - 1]) - s[j - 1])


def host_wait(starts: np.ndarray, launch: np.ndarray, gaps) -> float:
    """µs of the idle ``gaps`` (starts, ends) before the host had launched the device's next event:
    ``starts`` are the device events' starts in time order, ``launch`` their launch times (NaN: unlinked).

    Taught in chapter 9.
    """
    if gaps[0].size == 0:
        return 0.0
    nxt = np.searchsorted(starts, gaps[1], side="left")
    ok = nxt < starts.size
    first = np.full(gaps[0].size, np.nan)
    first[ok] = launch[nxt[ok]]
    wait = np.minimum(first, gaps[1]) - gaps[0]
    return float(np.nansum(np.clip(wait, 0, None)))


def _step_number(ev: RankEvents, name: str) -> int:
    """N of a ``ProfilerStep#N`` range (-1 for a bare ``ProfilerStep#``); ValueError naming the file."""
    num = name.split("#", 1)[1]
    if not num:
        return -1
    if not num.isdecimal():
        raise ValueError(f"trace file {ev.path}: a ProfilerStep range is named {name[:60]!r}; "
                         "expected 'ProfilerStep#<step number>'")
    if len(num) > 18:            # past int64 (and far past any real run): refuse, don't overflow
        raise ValueError(f"trace file {ev.path}: a ProfilerStep range is named {name[:60]!r}: the step "
                         "number is not valid (use a step number below 10**18)")
    return int(num)


def _clip(u, lo: float, hi: float):
    """``u`` (a merged, sorted, disjoint set) restricted to [lo, hi): two sorted searches then a slice,
    so a window costs the intervals inside it, not the whole trace (``intervals.clip`` scans all)."""
    s, e = u
    i0 = int(np.searchsorted(e, lo, side="right"))      # first interval ending after lo
    i1 = int(np.searchsorted(s, hi, side="left"))       # intervals starting before hi
    if i1 <= i0:
        return s[:0], e[:0]
    s = np.maximum(s[i0:i1], lo)
    e = np.minimum(e[i0:i1], hi)
    keep = e > s
    return s[keep], e[keep]


def _data_idle(gaps, dl) -> float:
    """Device idle caused by the data loader: every idle gap that a DataLoader span overlaps counts
    from the later of (gap start, span start) to the gap's end — the wait and the idle that follows
    it until the device has work again."""
    if gaps[0].size == 0 or dl[0].size == 0:
        return 0.0
    first = np.full(gaps[0].size, np.inf)
    for a, b in zip(dl[0], dl[1], strict=True):
        hit = (gaps[0] < b) & (gaps[1] > a)
        first[hit] = np.minimum(first[hit], np.maximum(gaps[0][hit], a))
    ok = np.isfinite(first)
    return float(np.sum(gaps[1][ok] - first[ok]))


def _gaps(busy, lo, hi):
    """Complement of a merged set within [lo, hi)."""
    s = np.concatenate([[lo], busy[1]])
    e = np.concatenate([busy[0], [hi]])
    keep = e > s
    return s[keep], e[keep]
