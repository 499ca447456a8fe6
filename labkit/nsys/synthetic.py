"""SYNTHETIC Nsight Systems reports for the CPU path of chapter 10 (seeded, labelled).

No GPU was available where the course was built, so ``datasets/nsys/`` holds reports made here: a
SQLite file in the schema of ``nsys export --type sqlite`` (the tables :mod:`labkit.nsys.sqlite`
reads) from a model of GPT training steps (:func:`synthesize_report`), and the ``nsys stats`` CSV
computed from it (:func:`build_dataset`, with :mod:`labkit.nsys.stats`). Every file says SYNTHETIC
(``META_DATA_EXPORT`` row, first CSV line). Re-exported by :mod:`labkit.nsys` (formerly
``labkit.nsys_synth``); the files' label names ``labkit.nsys.synthesize_report``, the face's name.

Taught in chapter 10 (``chapters/part2_diagnosis/ch10_nsight_nvtx.ipynb``).
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from labkit import checks
from labkit.nsys.sqlite import NVTX_PUSHPOP, read_sqlite
from labkit.nsys.stats import stats_from_timeline, to_stats_csv

__all__ = ["synthesize_report", "DATASETS", "build_dataset"]

# --------------------------------------------------------------------------- synthetic reports
_K = {  # name, median duration (us) on an H100-class GPU for a ~125M-parameter GPT step slice
    "gemm": ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
             "segment_k_off_kernel__5x_cublas", 180.0),
    "attn_f": ("void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
               "cutlass::bfloat16_t>, false, true, false, false, true, true, false>(Flash_fwd_params)", 95.0),
    "attn_b": ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, "
               "4, 2, 2, false, false, cutlass::bfloat16_t>, true, false, false, false, false>(Flash_bwd_params)", 210.0),
    "ew": ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
           "at::native::GeluType)::{lambda()#2}::operator()() const, at::detail::Array<char*, 2> >", 22.0),
    "ln": ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", 14.0),
    "nccl": ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 900.0),
    "adam": ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
             "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>", 60.0),
}


def synthesize_report(path: str | Path, *, seed: int = 0, steps: int = 4, layers: int = 6,
                      host_sync: bool = True, data_ms: float = 6.0, pinned: bool = False) -> Path:
    """Write a SYNTHETIC nsys SQLite export of ``steps`` training steps of a GPT on one GPU of a DDP job.

    The model of a step, all durations drawn from a seeded generator around the medians in ``_K``:
    a data range on the CPU (``data_ms``, no GPU work) and a host-to-device copy of the batch
    (pageable memory: a synchronous ``cudaMemcpy``; ``pinned=True``: ``cudaMemcpyAsync``); forward
    and backward kernels launched ~5 µs apart by ``cudaLaunchKernel`` on stream 7 (the GPU starts
    each kernel when both the launch has happened and the stream is free, so the CPU runs ahead);
    one NCCL all-reduce per layer on stream 20 during backward (DDP buckets); a fused AdamW; and,
    if ``host_sync``, a ``loss.item()`` (``cudaStreamSynchronize``) that drains the queue so the next
    step's data time is GPU idle time. The file carries ``META_DATA_EXPORT(SYNTHETIC=...)``.
    Taught in chapter 10.
    """
    checks.count("seed", seed, at_least=0)
    checks.count("steps", steps, at_most=10_000)
    checks.count("layers", layers, at_most=1_000)
    checks.nonneg("data_ms", data_ms)
    host_sync, pinned = checks.flag("host_sync", host_sync), checks.flag("pinned", pinned)
    rng = np.random.default_rng(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        return strings.setdefault(s, len(strings) + 1)

    pid, tid = 41230, 41230
    gtid = (pid << 24) | tid
    dur = lambda us: int(us * 1e3 * rng.lognormal(0.0, 0.08))
    cpu = 1_000_000                       # ns: CPU clock
    free = {7: 0, 20: 0}                  # ns: when each stream is next free
    corr = [0]
    nvtx, runtime, kernels, memcpy = [], [], [], []

    def api(name, us):
        nonlocal cpu
        corr[0] += 1
        s = cpu
        cpu += dur(us)
        runtime.append((s, cpu, gtid, corr[0], sid(name)))
        return s, corr[0]

    def launch(key, stream=7, after=0):
        nonlocal cpu
        s, c = api("cudaLaunchKernel_v7000", 4.5)
        name, med = _K[key]
        ks = max(s + 3_000, free[stream], after)
        ke = ks + dur(med)
        free[stream] = ke
        kernels.append((ks, ke, 0, 1, stream, c, pid, sid(name)))
        cpu += dur(0.6)
        return ke

    def rng_push(text):
        return [cpu, text]

    def rng_pop(r):
        nvtx.append((r[0], cpu, NVTX_PUSHPOP, gtid, sid(r[1])))

    batch_bytes = 8 * 1024 * 8                       # 8 x 1024 int64 tokens
    for step in range(steps):
        r_step = rng_push(f"step {step}")
        r = rng_push("data")
        cpu += dur(data_ms * 1e3)
        if pinned:
            s, c = api("cudaMemcpyAsync_v3020", 6.0)
            ms = max(s + 2_000, free[7])
            me = ms + dur(5.0)
            free[7] = me
        else:                                        # pageable: the copy waits for the stream
            corr[0] += 1
            s = cpu
            ms = max(s + 2_000, free[7])
            me = ms + dur(5.0)
            cpu = me + 2_000
            runtime.append((s, cpu, gtid, corr[0], sid("cudaMemcpy_v3020")))
            c = corr[0]
            free[7] = me
        memcpy.append((ms, me, 0, 1, 7, c, pid, batch_bytes, 1))
        rng_pop(r)
        r = rng_push("forward")
        for _ in range(layers):
            for key in ("ln", "gemm", "attn_f", "gemm", "ln", "gemm", "ew", "gemm"):
                launch(key)
        launch("gemm")
        rng_pop(r)
        r = rng_push("backward")
        for _layer in range(layers):
            for key in ("gemm", "gemm", "ew", "gemm", "ln", "gemm", "attn_b", "gemm", "gemm", "ln"):
                launch(key)
            cpu += dur(3.0)                          # DDP hook: bucket ready -> all-reduce on NCCL stream
            launch("nccl", stream=20, after=free[7])
        rng_pop(r)
        r = rng_push("optimizer")
        s, c = api("cudaStreamWaitEvent_v7000", 2.0)  # optimizer waits for the last all-reduce
        free[7] = max(free[7], free[20])
        launch("adam")
        launch("adam")
        rng_pop(r)
        if host_sync:
            r = rng_push("loss.item()")
            s = cpu
            corr[0] += 1
            cpu = max(cpu, free[7]) + dur(8.0)
            runtime.append((s, cpu, gtid, corr[0], sid("cudaStreamSynchronize_v3020")))
            rng_pop(r)
        rng_pop(r_step)

    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
            endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER,
            doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER,
            jsonText TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
            returnValue INTEGER NOT NULL, callchainId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,
            mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL,
            gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL,
            blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL,
            dynamicSharedMemory INTEGER NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL,
            deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
    """)
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId) VALUES (?,?,?,?,?)", nvtx)
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,1,?,?,?,0,NULL)", runtime)
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,NULL,0,0,64,132,1,1,"
                    "256,1,1,0,49152)", [k + (k[-1],) for k in kernels])
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,?,?,?,?,?,?,NULL,0,0)", memcpy)
    con.executemany("INSERT INTO StringIds VALUES (?,?)", [(i, s) for s, i in strings.items()])
    meta = (f"SYNTHETIC: made by labkit.nsys.synthesize_report(seed={seed}, steps={steps}, layers={layers}, "
            f"host_sync={host_sync}, data_ms={data_ms}, pinned={pinned}); not a recording of real hardware")
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('SYNTHETIC', ?)", (meta,))
    con.commit()
    con.close()
    return path


#: the shipped SYNTHETIC reports (datasets/nsys/): file stem -> synthesize_report keyword arguments
DATASETS = {
    "step_sync": dict(seed=0, steps=4, layers=6, host_sync=True, data_ms=6.0, pinned=False),
    "step_async": dict(seed=0, steps=4, layers=6, host_sync=False, data_ms=6.0, pinned=True),
}


def build_dataset(out_dir: str | Path) -> list[Path]:
    """(Re)generate ``datasets/nsys/``: for each entry of :data:`DATASETS` the SQLite export and the
    ``nsys stats`` CSV computed from it, both labelled SYNTHETIC. Taught in chapter 10."""
    out_dir = Path(out_dir)
    written = []
    for stem, kw in DATASETS.items():
        db = synthesize_report(out_dir / f"{stem}.sqlite", **kw)
        tl = read_sqlite(db)
        text = f"# {tl.synthetic}\n" + to_stats_csv(stats_from_timeline(tl))
        csv_path = out_dir / f"{stem}_stats.csv"
        csv_path.write_text(text)
        written += [db, csv_path]
    return written
