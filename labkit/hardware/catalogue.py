"""The accelerator catalogue: dense datasheet peaks per dtype, and safe device-name matching.

MFU divides achieved FLOP/s by a *peak* — get the peak wrong and every MFU is wrong. Known failure
modes this module exists to prevent (issue #2):

- a hard-coded A100 peak used on an H100 (nanoGPT's ``estimate_mfu`` -> "104% MFU");
- substring matching of device names (an A100 job given an H100-NVL peak; "MI350X" read as "MI300X");
- sparse ("with sparsity", the asterisked datasheet figures) peaks used as dense ones.

So: every :class:`DeviceSpec` holds **dense** peaks per dtype, each spec cites its datasheet in
``source``, and :func:`lookup` matches ``torch.cuda.get_device_name()`` strings by *exact token sets*
(aliases), never substrings; an alias claimed by two parts is rejected when the catalogue is built.
Unknown or ambiguous names raise and list the candidates; pass a user peak or measure one instead
(:mod:`labkit.hardware.measure`).

Torch-free. Taught in chapter 3 (FLOPs) and chapter 4 (MFU and HFU).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from labkit import checks
from labkit.units import GB, GIB, TERA

__all__ = ["DTYPES", "DeviceSpec", "CATALOGUE", "normalize_dtype", "known_devices", "lookup"]

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

# Words that vendors put in front of every name; they never distinguish one part from another.
_NOISE = frozenset({"nvidia", "amd", "tesla", "instinct", "radeon", "gpu", "vf", "google", "cloud"})


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator part: dense peak FLOP/s per dtype, memory size and bandwidth, and the source.

    ``peak_flops`` keys are in :data:`DTYPES`; values are dense (no 2:4 sparsity) FLOP/s for matrix
    (tensor-core / matrix-core) math where the part has it. ``aliases`` are token sets that
    :func:`lookup` accepts (e.g. the exact ``torch.cuda.get_device_name()`` output).

    Taught in chapter 4 (MFU and HFU).
    """

    name: str
    vendor: str
    peak_flops: dict[str, float]
    memory_bytes: int
    memory_bw: float
    source: str
    aliases: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self):
        for k in ("name", "vendor", "source", "note"):
            if not isinstance(getattr(self, k), str):
                raise checks.ArgumentTypeError(f"{k} must be a str, got {type(getattr(self, k)).__name__}")
        if not isinstance(self.peak_flops, dict) or not self.peak_flops:
            raise checks.ArgumentTypeError(f"peak_flops must be a non-empty dict {{dtype: FLOP/s}}, got "
                                           f"{self.peak_flops!r:.60}")
        peaks = {}
        for k, v in self.peak_flops.items():
            try:
                key = normalize_dtype(k)
            except ValueError as e:
                raise ValueError(f"peak_flops key {k!r}: {e}") from None
            peaks[key] = checks.positive(f"peak_flops[{k!r}]", v)
        object.__setattr__(self, "peak_flops", peaks)
        object.__setattr__(self, "memory_bytes", checks.count("memory_bytes", self.memory_bytes, at_least=0))
        object.__setattr__(self, "memory_bw", checks.positive("memory_bw", self.memory_bw))
        if not isinstance(self.aliases, (tuple, list)) or not all(isinstance(a, str) for a in self.aliases):
            raise checks.ArgumentTypeError(f"aliases must be a tuple of str, got {self.aliases!r:.60}")
        object.__setattr__(self, "aliases", tuple(self.aliases))

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (ValueError naming the dtypes this part has).

        Taught in chapter 4 (MFU and HFU).
        """
        key = normalize_dtype(dtype)
        if key not in self.peak_flops:
            raise ValueError(f"dtype={dtype!r}: {self.name} has no catalogued peak for it; "
                             f"it has {sorted(self.peak_flops)}")
        return self.peak_flops[key]

    def ridge_point(self, dtype: str) -> float:
        """FLOP per byte at which the roofline turns (peak / memory bandwidth). Chapter 6 (roofline)."""
        return self.peak(dtype) / self.memory_bw


def normalize_dtype(dtype) -> str:
    """Map "bfloat16", torch.bfloat16, "BF16", "float32", ... to a key of :data:`DTYPES`.

    Taught in chapter 4 (MFU and HFU).
    """
    if not (isinstance(dtype, str) or hasattr(dtype, "is_floating_point") or type(dtype).__name__ == "dtype"
            or "DType" in type(dtype).__name__):      # a str, a torch.dtype or a NumPy dtype
        raise checks.ArgumentTypeError(f"dtype must be a str such as 'bf16' or a torch dtype, got "
                                       f"{type(dtype).__name__} {dtype!r:.60}")
    s = str(dtype).lower().replace("torch.", "")
    table = {"float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "fp32": "fp32",
             "tf32": "tf32", "tensorfloat32": "tf32", "bfloat16": "bf16", "bf16": "bf16",
             "float16": "fp16", "half": "fp16", "fp16": "fp16", "fp64": "fp64", "fp8": "fp8",
             "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "int8": "int8"}
    if s not in table:
        raise ValueError(f"dtype={dtype!r} is not known; use one of {list(DTYPES)} "
                         "(or a torch dtype such as torch.bfloat16)")
    return table[s]


# ------------------------------------------------------------------------------------------------
# The catalogue. Dense figures; where a datasheet prints "X*" with "* with sparsity", we store X/2.
# ------------------------------------------------------------------------------------------------
_V100 = ("NVIDIA V100 Tensor Core GPU datasheet (1165301-r5), "
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (1758950-r4), https://www.nvidia.com/content/dam/en-zz/"
         "Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_A10 = ("NVIDIA A10 Tensor Core GPU datasheet, "
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf")
_A10G = ("NVIDIA publishes no A10G datasheet; figures as tabulated in 'NVIDIA A10 vs A10G for ML model "
         "inference' (Baseten), https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ ; "
         "memory per AWS EC2 G5, https://aws.amazon.com/ec2/instance-types/g5/")
_L4 = "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"
_L40S = "NVIDIA L40S GPU datasheet, https://www.nvidia.com/en-us/data-center/l40s/"
_H100 = ("NVIDIA H100 Tensor Core GPU datasheet, "
         "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_H200 = "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"
_GH200 = ("NVIDIA GH200 Grace Hopper Superchip datasheet, "
          "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip")
_B200 = ("NVIDIA HGX platform specifications (HGX B200, per-GPU column), "
         "https://www.nvidia.com/en-us/data-center/hgx/")
_MI250X = ("AMD Instinct MI250X accelerator datasheet, "
           "https://www.amd.com/system/files/documents/amd-instinct-mi250x-datasheet.pdf")
_MI300X = ("AMD Instinct MI300X accelerator data sheet, https://www.amd.com/content/dam/amd/en/documents/"
           "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf")
_MI325X = ("AMD Instinct MI325X accelerator data sheet, https://www.amd.com/content/dam/amd/en/documents/"
           "instinct-tech-docs/product-briefs/instinct-mi325x-datasheet.pdf")
_MI350 = ("AMD Instinct MI350 series (MI350X / MI355X) data sheet, "
          "https://www.amd.com/en/products/accelerators/instinct/mi350.html")
_TPUV4 = ("Google Cloud TPU v4 documentation, https://cloud.google.com/tpu/docs/v4 ; PaLM (Chowdhery et al. "
          "2022) App. B uses 275 TFLOP/s bf16 per chip")


def _spec(name, vendor, source, mem_gb, bw_gbs, aliases=(), note="", **peaks_tflops) -> DeviceSpec:
    return DeviceSpec(name=name, vendor=vendor, peak_flops={k: v * TERA for k, v in peaks_tflops.items()},
                      memory_bytes=int(mem_gb * GIB),  # datasheet "GB" of HBM/GDDR are binary GiB
                      memory_bw=bw_gbs * GB, source=source, aliases=tuple(aliases), note=note)


_SPECS = [
    # --- NVIDIA Volta: no bf16/tf32; fp16 tensor cores.
    _spec("V100-SXM2-16GB", "nvidia", _V100, 16, 900, ["Tesla V100-SXM2-16GB", "V100 SXM2 16GB"],
          fp64=7.8, fp32=15.7, fp16=125),
    _spec("V100-SXM2-32GB", "nvidia", _V100, 32, 900, ["Tesla V100-SXM2-32GB", "V100 SXM2 32GB"],
          fp64=7.8, fp32=15.7, fp16=125),
    _spec("V100-PCIe-16GB", "nvidia", _V100, 16, 900, ["Tesla V100-PCIE-16GB", "V100 PCIe 16GB"],
          fp64=7.0, fp32=14.0, fp16=112),
    _spec("V100-PCIe-32GB", "nvidia", _V100, 32, 900, ["Tesla V100-PCIE-32GB", "V100 PCIe 32GB"],
          fp64=7.0, fp32=14.0, fp16=112),
    # --- NVIDIA Ampere. A100 datasheet: FP64 tensor 19.5, FP32 19.5, TF32 156, BF16/FP16 312, INT8 624.
    _spec("A100-SXM-40GB", "nvidia", _A100, 40, 1555,
          ["NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB", "A100 SXM 40GB"],
          fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _spec("A100-SXM-80GB", "nvidia", _A100, 80, 2039,
          ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM-80GB", "A100 SXM4 80GB", "A100 SXM 80GB"],
          fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _spec("A100-PCIe-40GB", "nvidia", _A100, 40, 1555, ["NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"],
          fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624,
          note="datasheet peak equals SXM; the 250 W PCIe card sustains less under load"),
    _spec("A100-PCIe-80GB", "nvidia", _A100, 80, 1935, ["NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"],
          fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624,
          note="datasheet peak equals SXM; the 300 W PCIe card sustains less under load"),
    _spec("A10", "nvidia", _A10, 24, 600, ["NVIDIA A10"],
          fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250),
    _spec("A10G", "nvidia", _A10G, 24, 600, ["NVIDIA A10G"],
          fp32=35.0, tf32=35.0, bf16=70, fp16=70, int8=140,
          note="AWS-specific variant of the A10 with lower tensor throughput"),
    # --- NVIDIA Ada
    _spec("L4", "nvidia", _L4, 24, 300, ["NVIDIA L4"],
          fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5),
    _spec("L40S", "nvidia", _L40S, 48, 864, ["NVIDIA L40S"],
          fp32=91.6, tf32=183, bf16=362, fp16=362, fp8=733, int8=733),
    # --- NVIDIA Hopper. H100 datasheet prints sparse tensor figures (989*/1979*/3958* for SXM).
    _spec("H100-SXM", "nvidia", _H100, 80, 3350,
          ["NVIDIA H100 80GB HBM3", "H100 SXM5", "H100 SXM5 80GB", "NVIDIA H100 SXM5 80GB"],
          fp64=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    _spec("H100-PCIe", "nvidia", _H100, 80, 2000, ["NVIDIA H100 PCIe", "H100 PCIe 80GB"],
          fp64=51, fp32=51, tf32=378, bf16=756.5, fp16=756.5, fp8=1513, int8=1513),
    _spec("H100-NVL", "nvidia", _H100, 94, 3900, ["NVIDIA H100 NVL", "H100 NVL 94GB"],
          fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5,
          note="per GPU (the datasheet's NVL column; older revisions printed a two-GPU pair)"),
    _spec("H200-SXM", "nvidia", _H200, 141, 4800, ["NVIDIA H200", "H200 SXM", "NVIDIA H200 141GB HBM3e"],
          fp64=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    _spec("H200-NVL", "nvidia", _H200, 141, 4800, ["NVIDIA H200 NVL"],
          fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5,
          note="PCIe card at up to 600 W: lower peak than H200 SXM"),
    _spec("GH200-96GB", "nvidia", _GH200, 96, 4000, ["NVIDIA GH200 480GB", "GH200 96GB"],
          fp64=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979,
          note="the Hopper GPU of a GH200 superchip (96 GB HBM3); '480GB' in its name is the CPU's LPDDR5X"),
    _spec("GH200-144GB", "nvidia", _GH200, 144, 4900, ["NVIDIA GH200 144G HBM3e", "GH200 144GB"],
          fp64=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    # --- NVIDIA Blackwell (HGX B200 per-GPU column: TF32 2.2P*, BF16 4.5P*, FP8 9P* sparse).
    _spec("B200", "nvidia", _B200, 180, 7700, ["NVIDIA B200"],
          fp64=37, fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500, int8=4500),
    # --- AMD CDNA. The MI250X module has two GCDs; torch shows each GCD as one device.
    _spec("MI250X-OAM", "amd", _MI250X, 128, 3276.8, ["MI250X module"],
          fp64=95.7, fp32=95.7, bf16=383, fp16=383, int8=383,
          note="whole OAM module = 2 GCDs; torch sees each GCD as a device (MI250X-GCD)"),
    _spec("MI250X-GCD", "amd", _MI250X, 64, 1638.4, ["AMD Instinct MI250X", "AMD Instinct MI250X/MI250"],
          fp64=47.85, fp32=47.85, bf16=191.5, fp16=191.5, int8=191.5,
          note="one GCD = half of the MI250X datasheet figures; what one torch device is, so "
               "'MI250X' and the torch name resolve here, per device"),
    _spec("MI300X", "amd", _MI300X, 192, 5300, ["AMD Instinct MI300X", "AMD Instinct MI300X VF"],
          fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9),
    _spec("MI325X", "amd", _MI325X, 256, 6000, ["AMD Instinct MI325X"],
          fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9),
    _spec("MI350X", "amd", _MI350, 288, 8000, ["AMD Instinct MI350X"],
          fp64=72.1, fp32=144.2, bf16=2307, fp16=2307, fp8=4614, int8=4614,
          note="CDNA 4 has no TF32 matrix hardware"),
    _spec("MI355X", "amd", _MI350, 288, 8000, ["AMD Instinct MI355X"],
          fp64=78.6, fp32=157.3, bf16=2516.6, fp16=2516.6, fp8=5033.2, int8=5033.2,
          note="CDNA 4 has no TF32 matrix hardware"),
    # --- Google TPU v4 (for checking PaLM's published MFU).
    _spec("TPUv4", "google", _TPUV4, 32, 1200, ["TPU v4"], bf16=275, int8=275),
]


def _tokens(text: str) -> frozenset[str]:
    """Lower-case word tokens of a device name, vendor noise words dropped."""
    words = re.split(r"[\s\-_/,()]+", text.strip().lower())
    return frozenset(w for w in words if w and w not in _NOISE)


def _build_catalogue(specs) -> tuple[dict[str, DeviceSpec], dict[frozenset, str]]:
    """Catalogue by canonical name plus the alias index; refuses any alias claimed by two parts."""
    catalogue: dict[str, DeviceSpec] = {}
    index: dict[frozenset, str] = {}
    for spec in specs:
        if spec.name in catalogue:
            raise ValueError(f"duplicate catalogue name {spec.name!r}")
        catalogue[spec.name] = spec
        for alias in (spec.name, *spec.aliases):
            key = _tokens(alias)
            if key in index and index[key] != spec.name:
                raise ValueError(f"ambiguous alias {alias!r}: claimed by {index[key]} and {spec.name}")
            index[key] = spec.name
    return catalogue, index


CATALOGUE, _ALIAS_INDEX = _build_catalogue(_SPECS)


def known_devices() -> list[str]:
    """Canonical names of the catalogued parts. Taught in chapter 4 (MFU and HFU)."""
    return list(CATALOGUE)


def lookup(name: str) -> DeviceSpec:
    """The spec for a canonical name ("H100-SXM") or a ``torch.cuda.get_device_name()`` string.

    Matching compares *token sets* (case, separators and vendor words ignored) with each part's
    aliases; there is no substring matching, so "AMD Instinct MI350X" can never become MI300X and
    "NVIDIA H200 NVL" never H200 SXM. Unknown names raise ValueError listing the near candidates
    (parts sharing a token) and all known parts, and suggest passing a peak or measuring one.

    Taught in chapter 4 (MFU and HFU).
    """
    if not isinstance(name, str):
        raise checks.ArgumentTypeError(f"name must be a device name (a str) such as 'H100-SXM', got "
                                       f"{type(name).__name__} {name!r:.60}")
    if not name.strip():
        raise ValueError(f"name={name!r}: need a device name such as 'H100-SXM' or "
                         "torch.cuda.get_device_name()")
    key = _tokens(name)
    if key in _ALIAS_INDEX:
        return CATALOGUE[_ALIAS_INDEX[key]]
    near = sorted({canon for alias, canon in _ALIAS_INDEX.items() if alias & key})
    hint = (f"it is ambiguous or unknown; near candidates: {near}. " if near else "it is not catalogued. ")
    raise ValueError(f"device name {name!r}: {hint}Known parts: {known_devices()}. Pass the exact "
                     "part (e.g. 'H100-SXM'), or give peak_flops= yourself, or measure it with "
                     "labkit.hardware.measure_matmul_peak().")
