"""The datasheet table behind :mod:`labkit.hardware.catalogue`: one row per part, with its source.

Pure data (no labkit imports): :mod:`labkit.hardware.catalogue` turns each row into a ``DeviceSpec``.
Peaks are in TFLOP/s (TOP/s for int8), memory in datasheet "GB" (binary GiB of HBM/GDDR), bandwidth
in GB/s. Which figure each key holds (dense or sparse, tensor or vector) is documented in the
catalogue's module docstring: ``fp64`` is the non-tensor (vector) FP64 figure, ``fp64_tensor`` the
tensor/matrix-core one; ``tf32``/``bf16``/``fp16``/``fp8``/``int8`` are dense tensor-core figures
(a datasheet's "X*" with "* with sparsity" is stored as X/2); ``sparse=True`` adds ``<dtype>_sparse``
keys = the datasheet's starred figures. A key a datasheet does not give is left out (never guessed).

Taught in chapter 4 (MFU and HFU).
"""
from __future__ import annotations

__all__ = ["ROWS"]

_V100 = ("NVIDIA V100 Tensor Core GPU datasheet (1165301-r5), "
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (1758950-r4), https://www.nvidia.com/content/dam/en-zz/"
         "Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
         "(FP64 9.7, FP64 Tensor Core 19.5)")
_A10 = ("NVIDIA A10 Tensor Core GPU datasheet, "
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf")
_A10G = ("NVIDIA publishes no A10G datasheet; figures as tabulated in 'NVIDIA A10 vs A10G for ML model "
         "inference' (Baseten), https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ ; "
         "memory per AWS EC2 G5, https://aws.amazon.com/ec2/instance-types/g5/")
_A6000 = ("NVIDIA RTX A6000 datasheet (FP32 38.7 TFLOPS, tensor 309.7 TFLOPS with sparsity, 48 GB GDDR6, "
          "768 GB/s), https://www.nvidia.com/en-us/design-visualization/rtx-a6000/ ; dense FP16/BF16 154.8 and "
          "INT8 309.7 TOPS as tabulated from it in Microway's 'In-Depth Comparison of NVIDIA Ampere GPU "
          "Accelerators', https://www.microway.com/knowledge-center-articles/"
          "in-depth-comparison-of-nvidia-ampere-gpu-accelerators/ (via https://llmperf.net/categories/gpu/"
          "Nvidia-A6000-GPUs); TF32 and FP64 not found in a datasheet: left out")
_RTX6000ADA = ("NVIDIA RTX 6000 Ada Generation datasheet: FP32 91.1 TFLOPS, 48 GB GDDR6, 960 GB/s, "
               "https://www.nvidia.com/en-us/design-visualization/rtx-6000/ (figures as reported by "
               "https://www.grafikkarten.com/de/news/nvidia-rtx-6000-grafikkarte-der-ada-generation); its "
               "tensor-core figures were not found in a datasheet: left out, so bf16 needs a user or measured peak")
_L4 = "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"
_L40S = "NVIDIA L40S GPU datasheet, https://www.nvidia.com/en-us/data-center/l40s/"
_H100 = ("NVIDIA H100 Tensor Core GPU datasheet, "
         "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet "
         "(SXM: FP64 34, FP64 Tensor Core 67; PCIe: 26, 51)")
_H200 = ("NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/ "
         "(SXM: FP64 34, FP64 Tensor Core 67)")
_H20 = ("NVIDIA publishes no public H20 datasheet; figures (dense FP16/BF16 148, INT8 296, TF32 74, FP32 44; "
        "96 GB HBM3, 4.0 TB/s) as reported by https://willitrunai.com/es/gpus/h20-96gb and "
        "https://zangshuxian.com/new/674733024499207168 ; FP8, FP64 and sparse figures not found: left out")
_GH200 = ("NVIDIA GH200 Grace Hopper Superchip datasheet, "
          "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip")
_B200 = ("NVIDIA HGX platform specifications (HGX B200, per-GPU column; 'FP64/FP64 Tensor Core' is one "
         "figure), https://www.nvidia.com/en-us/data-center/hgx/")
_GB200 = ("NVIDIA GB200 NVL72 specifications, https://www.nvidia.com/en-us/data-center/gb200-nvl72/ , per GPU "
          "(the rack's 72): the per-GPU figures of the GB200 variant of B200 at 1,200 W from NVIDIA's Blackwell "
          "datasheet as tabulated at https://glennklockwood.com/garden/processors/B200 (FP64 45 vector and "
          "matrix, FP32 90, TF32 1,250 / BF16 2,500 / FP8 5,000 dense, twice that sparse); memory 13.4 TB and "
          "576 TB/s per 72 GPUs (https://aiwiki.ai/wiki/nvidia_gb200_nvl72) = 186 GB and 8 TB/s per GPU")
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

_AMD_FP64 = "fp64_tensor is the datasheet's FP64 matrix figure; its FP64 vector figure is not catalogued yet"


def _row(name, vendor, source, mem_gb, bw_gbs, aliases=(), note="", sparse=False, **peaks) -> dict:
    return dict(name=name, vendor=vendor, source=source, mem_gb=mem_gb, bw_gbs=bw_gbs, aliases=tuple(aliases),
                note=note, sparse=sparse, peaks=peaks)


_HOPPER_SXM = dict(fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979, fp64_tensor=67)
_HOPPER_NVL = dict(fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5, fp64_tensor=60)
_A100_PEAKS = dict(fp64=9.7, fp64_tensor=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624)

ROWS = [
    # --- NVIDIA Volta: no bf16/tf32; fp16 tensor cores; FP64 is vector only.
    _row("V100-SXM2-16GB", "nvidia", _V100, 16, 900, ["Tesla V100-SXM2-16GB", "V100 SXM2 16GB"],
         fp64=7.8, fp32=15.7, fp16=125),
    _row("V100-SXM2-32GB", "nvidia", _V100, 32, 900, ["Tesla V100-SXM2-32GB", "V100 SXM2 32GB"],
         fp64=7.8, fp32=15.7, fp16=125),
    _row("V100-PCIe-16GB", "nvidia", _V100, 16, 900, ["Tesla V100-PCIE-16GB", "V100 PCIe 16GB"],
         fp64=7.0, fp32=14.0, fp16=112),
    _row("V100-PCIe-32GB", "nvidia", _V100, 32, 900, ["Tesla V100-PCIE-32GB", "V100 PCIe 32GB"],
         fp64=7.0, fp32=14.0, fp16=112),
    # --- NVIDIA Ampere. A100 datasheet: FP64 9.7, FP64 tensor 19.5, FP32 19.5, TF32 156, BF16/FP16 312, INT8 624.
    _row("A100-SXM-40GB", "nvidia", _A100, 40, 1555,
         ["NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB", "A100 SXM 40GB"], sparse=True, **_A100_PEAKS),
    _row("A100-SXM-80GB", "nvidia", _A100, 80, 2039,
         ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM-80GB", "A100 SXM4 80GB", "A100 SXM 80GB"], sparse=True,
         **_A100_PEAKS),
    _row("A100-PCIe-40GB", "nvidia", _A100, 40, 1555, ["NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"], sparse=True,
         note="datasheet peak equals SXM; the 250 W PCIe card sustains less under load", **_A100_PEAKS),
    _row("A100-PCIe-80GB", "nvidia", _A100, 80, 1935, ["NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"], sparse=True,
         note="datasheet peak equals SXM; the 300 W PCIe card sustains less under load", **_A100_PEAKS),
    _row("A10", "nvidia", _A10, 24, 600, ["NVIDIA A10"], sparse=True,
         fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250),
    _row("A10G", "nvidia", _A10G, 24, 600, ["NVIDIA A10G"],
         fp32=35.0, tf32=35.0, bf16=70, fp16=70, int8=140,
         note="AWS-specific variant of the A10 with lower tensor throughput"),
    _row("RTX-A6000", "nvidia", _A6000, 48, 768, ["NVIDIA RTX A6000", "RTX A6000"], sparse=True,
         fp32=38.7, bf16=154.8, fp16=154.8, int8=309.7,
         note="workstation Ampere (GA102); tf32 and fp64 not catalogued"),
    # --- NVIDIA Ada
    _row("L4", "nvidia", _L4, 24, 300, ["NVIDIA L4"], sparse=True,
         fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5),
    _row("L40S", "nvidia", _L40S, 48, 864, ["NVIDIA L40S"], sparse=True,
         fp32=91.6, tf32=183, bf16=362, fp16=362, fp8=733, int8=733),
    _row("RTX-6000-Ada", "nvidia", _RTX6000ADA, 48, 960,
         ["NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"], fp32=91.1,
         note="only the FP32 (non-tensor) peak is catalogued"),
    # --- NVIDIA Hopper. H100 datasheet prints sparse tensor figures (989*/1979*/3958* for SXM).
    _row("H100-SXM", "nvidia", _H100, 80, 3350,
         ["NVIDIA H100 80GB HBM3", "H100 SXM5", "H100 SXM5 80GB", "NVIDIA H100 SXM5 80GB"], sparse=True,
         fp64=34, **_HOPPER_SXM),
    _row("H100-PCIe", "nvidia", _H100, 80, 2000, ["NVIDIA H100 PCIe", "H100 PCIe 80GB"], sparse=True,
         fp64=26, fp64_tensor=51, fp32=51, tf32=378, bf16=756.5, fp16=756.5, fp8=1513, int8=1513),
    _row("H100-NVL", "nvidia", _H100, 94, 3900, ["NVIDIA H100 NVL", "H100 NVL 94GB"], sparse=True,
         note="per GPU (the datasheet's NVL column; older revisions printed a two-GPU pair); "
              "non-tensor fp64 not catalogued", **_HOPPER_NVL),
    _row("H200-SXM", "nvidia", _H200, 141, 4800, ["NVIDIA H200", "H200 SXM", "NVIDIA H200 141GB HBM3e"],
         sparse=True, fp64=34, **_HOPPER_SXM),
    _row("H200-NVL", "nvidia", _H200, 141, 4800, ["NVIDIA H200 NVL"], sparse=True,
         note="PCIe card at up to 600 W: lower peak than H200 SXM; non-tensor fp64 not catalogued", **_HOPPER_NVL),
    _row("H20", "nvidia", _H20, 96, 4000, ["NVIDIA H20", "H20 96GB"],
         fp32=44, tf32=74, bf16=148, fp16=148, int8=296,
         note="export-limited Hopper for China; no public NVIDIA datasheet (see source)"),
    _row("GH200-96GB", "nvidia", _GH200, 96, 4000, ["NVIDIA GH200 480GB", "GH200 96GB"], sparse=True,
         note="the Hopper GPU of a GH200 superchip (96 GB HBM3); '480GB' in its name is the CPU's LPDDR5X; "
              "non-tensor fp64 not catalogued", **_HOPPER_SXM),
    _row("GH200-144GB", "nvidia", _GH200, 144, 4900, ["NVIDIA GH200 144G HBM3e", "GH200 144GB"], sparse=True,
         note="non-tensor fp64 not catalogued", **_HOPPER_SXM),
    # --- NVIDIA Blackwell (HGX B200 per-GPU column: TF32 2.2P*, BF16 4.5P*, FP8 9P* sparse).
    _row("B200", "nvidia", _B200, 180, 7700, ["NVIDIA B200"], sparse=True,
         fp64=37, fp64_tensor=37, fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500, int8=4500),
    _row("GB200", "nvidia", _GB200, 186, 8000, ["NVIDIA GB200", "GB200 NVL72"], sparse=True,
         fp64=45, fp64_tensor=45, fp32=90, tf32=1250, bf16=2500, fp16=2500, fp8=5000, int8=5000,
         note="one Blackwell GPU of a GB200 superchip (two per superchip, 72 per NVL72 rack), at 1,200 W"),
    # --- AMD CDNA. The MI250X module has two GCDs; torch shows each GCD as one device.
    _row("MI250X-OAM", "amd", _MI250X, 128, 3276.8, ["MI250X module"],
         fp64_tensor=95.7, fp32=95.7, bf16=383, fp16=383, int8=383,
         note="whole OAM module = 2 GCDs; torch sees each GCD as a device (MI250X-GCD); " + _AMD_FP64),
    _row("MI250X-GCD", "amd", _MI250X, 64, 1638.4, ["AMD Instinct MI250X", "AMD Instinct MI250X/MI250"],
         fp64_tensor=47.85, fp32=47.85, bf16=191.5, fp16=191.5, int8=191.5,
         note="one GCD = half of the MI250X datasheet figures; what one torch device is, so "
              "'MI250X' and the torch name resolve here, per device; " + _AMD_FP64),
    _row("MI300X", "amd", _MI300X, 192, 5300, ["AMD Instinct MI300X", "AMD Instinct MI300X VF"],
         fp64_tensor=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9,
         note=_AMD_FP64),
    _row("MI325X", "amd", _MI325X, 256, 6000, ["AMD Instinct MI325X"],
         fp64_tensor=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9,
         note=_AMD_FP64),
    _row("MI350X", "amd", _MI350, 288, 8000, ["AMD Instinct MI350X"],
         fp64_tensor=72.1, fp32=144.2, bf16=2307, fp16=2307, fp8=4614, int8=4614,
         note="CDNA 4 has no TF32 matrix hardware; " + _AMD_FP64),
    _row("MI355X", "amd", _MI350, 288, 8000, ["AMD Instinct MI355X"],
         fp64_tensor=78.6, fp32=157.3, bf16=2516.6, fp16=2516.6, fp8=5033.2, int8=5033.2,
         note="CDNA 4 has no TF32 matrix hardware; " + _AMD_FP64),
    # --- Google TPU v4 (for checking PaLM's published MFU).
    _row("TPUv4", "google", _TPUV4, 32, 1200, ["TPU v4"], bf16=275, int8=275),
]
