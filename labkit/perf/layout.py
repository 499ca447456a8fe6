"""What a performance prediction is *of*: a parallel :class:`Layout` on a :class:`Cluster`.

A layout splits the world into dp × tp × pp × cp ranks (EP carves its groups out of dp, as in
Megatron-LM, so it does not add ranks). ``Layout.order`` numbers the ranks, innermost first: by default
TP, then CP, DP and PP outermost (Megatron-Core's default ``order="tp-cp-ep-dp-pp"`` of
``parallel_state.initialize_model_parallel``): a TP group is tp consecutive GPUs, so with tp ≤ GPUs per
node it stays inside a node, and the DP and PP groups stride across nodes. ``order="tp-cp-pp-dp"`` (the
order Megatron-Core also accepts, PP inside DP) puts a TP × PP block of tp·cp·pp ≤ GPUs per node inside one
node, so only the DP gradient reduction crosses the nodes' links.

A cluster is nodes × GPUs of one catalogued device (:mod:`labkit.hardware`: peak per dtype, HBM) and
two links described by the α–β model of :mod:`labkit.comm.models`: α = latency per ring step (s),
bandwidth = bytes/s per GPU per direction inside a node (NVLink bus bandwidth) and bytes/s per *node*
per direction between nodes (all NICs together; when every GPU of a node talks across nodes at once
each gets 1/gpus_per_node of it).

Presets (:data:`CLUSTERS`, :func:`cluster`) cite their figures; what is an assumption says so in the
preset's ``description``.

Taught in chapter 24 (choosing a parallel layout) and chapter 23 (multi-node communication).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from labkit import checks

__all__ = ["STRATEGIES", "SCHEDULES", "RECOMPUTE", "DTYPES", "ORDERS", "Layout", "Cluster", "CLUSTERS", "cluster"]

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp")     # rank numbering, innermost first (Megatron-Core's ``order``)


@dataclass(frozen=True)
class Layout:
    """A parallel layout: degrees, DP strategy, pipeline schedule, micro-batching, recompute, dtype.

    ``accum``: micro-batches per DP rank per optimizer step — gradient accumulation without a pipeline,
    the pipeline's micro-batches m with one (None: derived from the global batch by
    :func:`labkit.perf.predict`). ``virtual_stages`` (v) only with ``schedule="interleaved"``.
    ``sequence_parallel``: Megatron sequence parallelism with TP (Korthikanti et al. 2022 §4.2.2);
    ``flash_attention``: the s×s attention scores are never stored (Dao et al. 2022), as today's
    trainers do — False for 2019–2021 setups (Megatron SC21), which keep 5as²b bytes per layer.
    ``ep``: expert-parallel degree, a divisor of dp (EP groups live inside DP). ``order``: how ranks are
    numbered, innermost first (:data:`ORDERS`; module docstring): "tp-cp-pp-dp" keeps TP × PP inside a node.
    ``dtype="fp8"``: the linear layers' GEMMs in fp8 (Transformer Engine's recipe: Micikevicius et al.
    2022, *FP8 Formats for Deep Learning*, arXiv:2209.05433), attention, norms and activations in bf16.
    ``dtype="tf32"``: fp32 tensors whose matmuls run on the TF32 tensor cores (PyTorch's
    ``torch.backends.cuda.matmul.allow_tf32``, False by default since 1.12); stored and sent as fp32.

    Taught in chapter 24 (choosing a parallel layout).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    strategy: str = "ddp"
    micro_batch: int = 1
    accum: int | None = None
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    dtype: str = "bf16"
    sequence_parallel: bool = False
    flash_attention: bool = True
    order: str = "tp-cp-dp-pp"

    def __post_init__(self):
        for k in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "virtual_stages"):
            object.__setattr__(self, k, checks.count(k, getattr(self, k)))
        if self.accum is not None:
            object.__setattr__(self, "accum", checks.count("accum", self.accum))
        checks.one_of("strategy", self.strategy, STRATEGIES)
        checks.one_of("schedule", self.schedule, SCHEDULES)
        checks.one_of("recompute", self.recompute, RECOMPUTE)
        checks.one_of("dtype", self.dtype, DTYPES)
        checks.one_of("order", self.order, ORDERS)
        object.__setattr__(self, "sequence_parallel", checks.flag("sequence_parallel", self.sequence_parallel))
        object.__setattr__(self, "flash_attention", checks.flag("flash_attention", self.flash_attention))
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep} is not valid: it must divide dp={self.dp} (EP groups live inside DP)")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError(f"virtual_stages={self.virtual_stages} is not valid with schedule={self.schedule!r}: "
                             "virtual stages need schedule='interleaved'")
        if self.schedule == "interleaved" and self.pp == 1:
            raise ValueError("schedule='interleaved' is not valid with pp=1: interleaving needs pipeline stages")

    @property
    def world_size(self) -> int:
        """GPUs the layout occupies: dp · tp · pp · cp."""
        return self.dp * self.tp * self.pp * self.cp

    def stride(self, dim: str) -> int:
        """Ranks between neighbours of a ``dim`` group ("tp", "cp", "dp", "pp"; "ep" groups are the first ep
        ranks of dp's): the product of the degrees numbered inside it by :attr:`order`."""
        dims = self.order.split("-")
        d = checks.one_of("dim", "dp" if dim == "ep" else dim, dims)
        out = 1
        for inner in dims[:dims.index(d)]:
            out *= getattr(self, inner)
        return out

    def group_ranks(self, *dims: str) -> list[int]:
        """The global ranks of rank 0's group over ``dims`` (("dp", "cp"): the gradient reduction; ("tp", "pp"):
        one model replica's TP × PP block), sorted. Taught in chapter 24 and chapter 29."""
        ranks = [0]
        for d in dims:
            n, step = (self.ep if d == "ep" else getattr(self, d)), self.stride(d)
            ranks = [r + i * step for r in ranks for i in range(n)]
        return sorted(ranks)

    def with_(self, **kw) -> Layout:
        """A copy with fields changed (validated again)."""
        return replace(self, **kw)

    def describe(self) -> str:
        s = f"DP{self.dp}({self.strategy}) TP{self.tp} PP{self.pp}"
        if self.pp > 1:
            s += f"[{self.schedule}" + (f", v={self.virtual_stages}" if self.virtual_stages > 1 else "") + "]"
        s += (f" CP{self.cp}" if self.cp > 1 else "") + (f" EP{self.ep}" if self.ep > 1 else "")
        s += f", micro-batch {self.micro_batch}"
        s += f" × {self.accum}" if self.accum is not None else ""
        s += f", recompute {self.recompute}, {self.dtype}" + (", SP" if self.sequence_parallel else "")
        return s + (f", ranks {self.order}" if self.order != ORDERS[0] else "")


@dataclass(frozen=True)
class Cluster:
    """nodes × gpus_per_node of one catalogued ``device``, with an intra-node and an inter-node link.

    ``intra_bw``: bytes/s per GPU per direction inside a node (the bus bandwidth a ring reaches);
    ``inter_bw``: bytes/s per node per direction between nodes (all its NICs); ``*_alpha_s``: latency
    per ring step. ``memory_bytes`` per GPU defaults to the catalogue's HBM.

    Taught in chapter 24 (choosing a parallel layout) and chapter 23.
    """

    name: str
    device: str
    gpus_per_node: int
    nodes: int
    intra_bw: float
    inter_bw: float
    intra_alpha_s: float = 5e-6
    inter_alpha_s: float = 10e-6
    memory_bytes: int | None = None
    description: str = ""

    def __post_init__(self):
        for k in ("name", "device", "description"):
            if not isinstance(getattr(self, k), str):
                raise checks.ArgumentTypeError(f"{k} must be a str, got {type(getattr(self, k)).__name__} "
                                               f"{getattr(self, k)!r:.60}")
        spec = self.spec                       # an unknown device raises, listing the known parts
        object.__setattr__(self, "gpus_per_node", checks.count("gpus_per_node", self.gpus_per_node))
        object.__setattr__(self, "nodes", checks.count("nodes", self.nodes))
        for k in ("intra_bw", "inter_bw"):
            object.__setattr__(self, k, checks.positive(k, getattr(self, k)))
        for k in ("intra_alpha_s", "inter_alpha_s"):
            object.__setattr__(self, k, checks.nonneg(k, getattr(self, k)))
        mem = spec.memory_bytes if self.memory_bytes is None else self.memory_bytes
        object.__setattr__(self, "memory_bytes", checks.count("memory_bytes", mem))

    @property
    def spec(self):
        """The device's :class:`labkit.hardware.catalogue.DeviceSpec`."""
        from labkit.hardware.catalogue import lookup

        return lookup(self.device)

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def peak(self, dtype: str) -> float:
        """Dense datasheet peak FLOP/s per GPU for ``dtype`` (fp16 on a part without bf16: a V100)."""
        return self.spec.peak(dtype)

    @property
    def intra_beta(self) -> float:
        """Seconds per byte of one GPU's intra-node link."""
        return 1.0 / self.intra_bw

    @property
    def inter_beta(self) -> float:
        """Seconds per byte of one GPU's share of its node's NICs (all GPUs of a node talking at once)."""
        return self.gpus_per_node / self.inter_bw

    def with_links(self, *, intra=None, inter=None) -> Cluster:
        """The same cluster with links *measured* instead of catalogued: ``intra`` an α–β fitted to a ring
        inside one node, ``inter`` one fitted to a ring that spans nodes (its slowest hop is the network,
        so 1/β is the node's bandwidth between nodes, the busbw such a test reaches). Each is a
        :class:`labkit.comm.AlphaBeta`: from a parsed nccl-tests table (``labkit.comm.parse(text)[1].fit()``)
        or a live sweep (:func:`labkit.comm.benchmark` + :func:`labkit.comm.fit_alpha_beta`). The description
        says which links were fitted. Taught in chapter 24 (a cluster from its own measurements) and chapter 11."""
        kw, said = {}, []
        for name, ab in (("intra", intra), ("inter", inter)):
            if ab is None:
                continue
            if not all(hasattr(ab, k) for k in ("alpha_s", "beta_s_per_byte", "nranks", "op")):
                raise checks.ArgumentTypeError(f"{name} must be a labkit.comm.AlphaBeta (a fit), got "
                                               f"{type(ab).__name__} {ab!r:.60}")
            n, g = ab.nranks, self.gpus_per_node
            if name == "intra" and n > g:
                raise ValueError(f"intra was fitted on {n} ranks, more than a node's {g} GPUs: it crossed nodes; "
                                 "give it as inter=")
            if name == "inter" and n <= g:
                raise ValueError(f"inter was fitted on {n} ranks, within one node of {g} GPUs: it never crossed "
                                 "the network; give it as intra=")
            beta = checks.positive(f"{name}.beta_s_per_byte", ab.beta_s_per_byte)
            kw[f"{name}_bw"], kw[f"{name}_alpha_s"] = 1.0 / beta, checks.nonneg(f"{name}.alpha_s", ab.alpha_s)
            said.append(f"{name}-node link fitted ({ab.op} on {n} ranks: α {ab.alpha_s * 1e6:.1f} µs, "
                        f"{1 / beta / 1e9:.3g} GB/s)")
        if not kw:
            raise ValueError("with_links needs intra= or inter= (an AlphaBeta fit), got neither")
        return replace(self, **kw, description=f"{self.description}; " + "; ".join(said) if self.description
                       else "; ".join(said))

    def with_nodes(self, nodes: int) -> Cluster:
        """The same cluster with ``nodes`` nodes."""
        return replace(self, nodes=checks.count("nodes", nodes))

    def describe(self) -> str:
        return (f"{self.name}: {self.nodes} node(s) × {self.gpus_per_node} {self.device} "
                f"({self.memory_bytes / 2**30:.0f} GiB); intra-node {self.intra_bw / 1e9:g} GB/s per GPU, "
                f"α {self.intra_alpha_s * 1e6:g} µs; inter-node {self.inter_bw / 1e9:g} GB/s per node "
                f"({self.inter_bw / self.gpus_per_node / 1e9:.3g} GB/s per GPU), α {self.inter_alpha_s * 1e6:g} µs")


_GB = 1e9
_ALPHA_NOTE = ("α (per ring step) is an assumption: ~5 µs inside a node and ~10 µs over InfiniBand, the order "
               "nccl-tests shows for small messages; bandwidths are datasheet line rates, which nccl-tests' "
               "busbw reaches within ~10-25% for large messages (so these are optimistic)")

# Presets. Figures and sources:
# - DGX A100 User Guide (https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html):
#   8× A100-SXM 80GB, third-generation NVLink/NVSwitch at 600 GB/s bidirectional per GPU (→ 300 GB/s per
#   direction), 8 single-port ConnectX-6 200 Gb/s HDR InfiniBand for the compute fabric (8 × 25 GB/s).
# - DGX H100 User Guide (https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html):
#   8× H100-SXM 80GB, fourth-generation NVLink at 900 GB/s bidirectional per GPU (→ 450 GB/s per
#   direction), 8 ConnectX-7 400 Gb/s InfiniBand/Ethernet ports for compute (8 × 50 GB/s).
# - V100 datasheet (1165301-r5, cited by labkit.hardware.datasheets): V100 SXM2 NVLink 300 GB/s
#   bidirectional (six 25 GB/s-per-direction links → 150 GB/s per direction).
# - 25 Gb/s Ethernet: 25e9/8 = 3.125 GB/s line rate per node (IEEE 802.3by); the course's chapter 29 case.
CLUSTERS = {
    "dgx-a100": Cluster("dgx-a100", "A100-SXM-80GB", 8, 8, intra_bw=300 * _GB, inter_bw=8 * 25 * _GB,
                        intra_alpha_s=5e-6, inter_alpha_s=10e-6,
                        description="DGX A100 (NVIDIA DGX A100 User Guide): NVLink 300 GB/s per direction per GPU, "
                                    "8×200 Gb/s HDR InfiniBand per node. Node count (8) is an assumption; "
                                    + _ALPHA_NOTE),
    "dgx-h100": Cluster("dgx-h100", "H100-SXM", 8, 8, intra_bw=450 * _GB, inter_bw=8 * 50 * _GB,
                        intra_alpha_s=5e-6, inter_alpha_s=10e-6,
                        description="DGX H100 (NVIDIA DGX H100 User Guide): NVLink 450 GB/s per direction per GPU, "
                                    "8×400 Gb/s InfiniBand per node. Node count (8) is an assumption; "
                                    + _ALPHA_NOTE),
    "a100-25gbe": Cluster("a100-25gbe", "A100-SXM-80GB", 8, 8, intra_bw=300 * _GB, inter_bw=25e9 / 8,
                          intra_alpha_s=5e-6, inter_alpha_s=25e-6,
                          description="the course's chapter 29 case: 8×A100-SXM-80GB nodes with NVLink (DGX A100 "
                                      "figure) joined by ONE 25 Gb/s Ethernet port per node (3.125 GB/s line rate, "
                                      "shared by 8 GPUs). Assumptions: one port per node, line rate (TCP sockets "
                                      "reach ~90% of it), α 25 µs per step over sockets (as labkit.comm.synthetic's "
                                      "pcie-2node-25gbe fabric), 8 nodes (use with_nodes(16) for 128 GPUs)"),
    "v100-nvlink-4": Cluster("v100-nvlink-4", "V100-SXM2-16GB", 4, 1, intra_bw=150 * _GB, inter_bw=100e9 / 8,
                             intra_alpha_s=5e-6, inter_alpha_s=15e-6,
                             description="the course's BERT-large case (chapters 5 and 30): one node of 4 V100-SXM2 "
                                         "with NVLink (V100 datasheet: 300 GB/s bidirectional → 150 GB/s per "
                                         "direction). Assumptions: the 16 GB part, a ring reaching the full "
                                         "NVLink figure, and a 100 Gb/s Ethernet port per node (unused at one node)"),
}


def cluster(name: str, *, nodes: int | None = None) -> Cluster:
    """A preset cluster from :data:`CLUSTERS` (``nodes`` overrides its node count).

    Taught in chapter 24 (choosing a parallel layout).
    """
    checks.one_of("cluster", name, CLUSTERS)
    c = CLUSTERS[name]
    return c if nodes is None else c.with_nodes(nodes)
