"""The accelerator catalogue: datasheet peaks per dtype, and safe device-name matching.

MFU divides achieved FLOP/s by a *peak* — get the peak wrong and every MFU is wrong. Known failure
modes this module exists to prevent (issue #2):

- a hard-coded A100 peak used on an H100 (nanoGPT's ``estimate_mfu`` -> "104% MFU");
- substring matching of device names (an A100 job given an H100-NVL peak; "MI350X" read as "MI300X");
- sparse ("with sparsity", the asterisked datasheet figures) peaks used as dense ones.

Which figure each ``peak_flops`` key holds (FLOP/s per device; OP/s for int8):

=================  ===========================================================================
``fp64``           FP64 on the **vector** (non-tensor) units — the datasheet's plain "FP64"
``fp64_tensor``    FP64 on tensor / matrix cores ("FP64 Tensor Core", AMD "FP64 Matrix")
``fp32``           FP32, non-tensor (vector) — what an FP32 matmul without TF32 runs at
``tf32``           TF32 tensor-core, **dense**
``bf16``/``fp16``  16-bit tensor-core, **dense** — the MFU default for bf16/fp16 training
``fp8``/``int8``   8-bit tensor-core, **dense**
``<dtype>_sparse`` the datasheet's 2:4-structured-sparsity figure ("X*", "* with sparsity") for
                   tf32, bf16, fp16, fp8, int8 — twice the dense one; never used for MFU
=================  ===========================================================================

So every MFU divides by a **dense** figure: :meth:`DeviceSpec.peak` of a dtype ("bf16", torch.bfloat16)
is the dense tensor-core peak; ``peak("bf16_sparse")`` or ``peak("fp64_tensor")`` must be asked for
by name. A key a datasheet does not give is left out (the source says so), never guessed. The table
itself, each row citing its datasheet, is :mod:`labkit.hardware.datasheets`.

:func:`lookup` matches ``torch.cuda.get_device_name()`` strings by *exact token sets* (aliases), never
substrings; an alias claimed by two parts is rejected when the catalogue is built. Unknown or ambiguous
names raise and list the candidates; pass a user peak or measure one instead
(:mod:`labkit.hardware.measure`). A family name ("A100", "V100 SXM2") names several parts:
:func:`family` gives them, and :func:`lookup_peak` / :meth:`DeviceFamily.peak` return their peak for a
dtype when all of them agree, else raise listing each part with its figure.

Torch-free. Taught in chapter 3 (FLOPs) and chapter 4 (MFU and HFU).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from labkit import checks
from labkit.hardware import datasheets
from labkit.units import GB, GIB, TERA

__all__ = ["DTYPES", "PEAK_KEYS", "DeviceSpec", "DeviceFamily", "CATALOGUE", "normalize_dtype", "known_devices",
           "lookup", "family", "lookup_peak"]

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
_SPARSE_OF = ("tf32", "bf16", "fp16", "fp8", "int8")
#: every key a ``peak_flops`` dict may hold: the dtypes, tensor-core FP64, and the sparse figures
PEAK_KEYS = DTYPES + ("fp64_tensor",) + tuple(f"{d}_sparse" for d in _SPARSE_OF)

# Words that vendors put in front of every name; they never distinguish one part from another.
_NOISE = frozenset({"nvidia", "amd", "tesla", "instinct", "radeon", "gpu", "vf", "google", "cloud"})


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator part: peak FLOP/s per key, memory size and bandwidth, and the source.

    ``peak_flops`` keys are in :data:`PEAK_KEYS` (a dtype alias such as "bfloat16" is normalised); the
    module docstring says which figure each holds: dtype keys are dense tensor-core figures (``fp64`` and
    ``fp32`` the vector ones), ``fp64_tensor`` and ``*_sparse`` are asked for by name. ``aliases`` are
    token sets that :func:`lookup` accepts (e.g. the exact ``torch.cuda.get_device_name()`` output).

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
                key = _peak_key(k)
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
        """Peak FLOP/s for ``dtype`` — dense for a dtype; ``"fp64_tensor"`` or ``"bf16_sparse"`` by name
        (ValueError naming the keys this part has).

        Taught in chapter 4 (MFU and HFU).
        """
        key = _peak_key(dtype)
        if key not in self.peak_flops:
            raise ValueError(f"dtype={dtype!r}: {self.name} has no catalogued peak for it; "
                             f"it has {sorted(self.peak_flops)}")
        return self.peak_flops[key]

    def ridge_point(self, dtype: str) -> float:
        """FLOP per byte at which the roofline turns (peak / memory bandwidth). Chapter 6 (roofline)."""
        return self.peak(dtype) / self.memory_bw


def _peak_key(key) -> str:
    """A :data:`PEAK_KEYS` entry: "fp64_tensor" / "bf16_sparse" as they are, a dtype normalised."""
    if isinstance(key, str) and key.strip().lower() in PEAK_KEYS[len(DTYPES):]:
        return key.strip().lower()
    return normalize_dtype(key)


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


def _spec(name, vendor, source, mem_gb, bw_gbs, aliases=(), note="", sparse=False, peaks=None) -> DeviceSpec:
    """A :class:`DeviceSpec` from a :data:`labkit.hardware.datasheets.ROWS` row (TFLOP/s, GB, GB/s)."""
    flops = {k: v * TERA for k, v in peaks.items()}
    if sparse:       # the datasheet's "with sparsity" figures: twice the dense ones
        flops |= {f"{k}_sparse": 2 * flops[k] for k in _SPARSE_OF if k in flops}
    return DeviceSpec(name=name, vendor=vendor, peak_flops=flops,
                      memory_bytes=int(mem_gb * GIB),  # datasheet "GB" of HBM/GDDR are binary GiB
                      memory_bw=bw_gbs * GB, source=source, aliases=tuple(aliases), note=note)


_SPECS = [_spec(**row) for row in datasheets.ROWS]


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


def _check_name(name) -> frozenset:
    if not isinstance(name, str):
        raise checks.ArgumentTypeError(f"name must be a device name (a str) such as 'H100-SXM', got "
                                       f"{type(name).__name__} {name!r:.60}")
    if not name.strip():
        raise ValueError(f"name={name!r}: need a device name such as 'H100-SXM' or "
                         "torch.cuda.get_device_name()")
    return _tokens(name)


def _family_parts(key: frozenset) -> list[DeviceSpec]:
    """Parts with a name or alias holding every token of ``key`` ("A100" -> the four A100s)."""
    if not key:
        return []
    return [spec for spec in CATALOGUE.values() if any(key <= _tokens(a) for a in (spec.name, *spec.aliases))]


def lookup(name: str) -> DeviceSpec:
    """The spec for a canonical name ("H100-SXM") or a ``torch.cuda.get_device_name()`` string.

    Matching compares *token sets* (case, separators and vendor words ignored) with each part's
    aliases; there is no substring matching, so "AMD Instinct MI350X" can never become MI300X and
    "NVIDIA H200 NVL" never H200 SXM. Unknown names raise ValueError listing the near candidates
    (parts sharing a token) and all known parts, and suggest passing a peak or measuring one. A family
    name ("A100") raises too — one part is needed for memory and bandwidth — and points to
    :func:`lookup_peak`, which answers when only the peak matters and all the family agree.

    Taught in chapter 4 (MFU and HFU).
    """
    key = _check_name(name)
    if key in _ALIAS_INDEX:
        return CATALOGUE[_ALIAS_INDEX[key]]
    members = [s.name for s in _family_parts(key)]
    near = sorted({canon for alias, canon in _ALIAS_INDEX.items() if alias & key})
    hint = (f"it is ambiguous or unknown; near candidates: {near}. " if near else "it is not catalogued. ")
    if len(members) > 1:
        hint = (f"it names a family of {len(members)} parts (near candidates: {sorted(members)}); for its peak use "
                "labkit.hardware.lookup_peak(name, dtype), which answers when they all agree. ")
    raise ValueError(f"device name {name!r}: {hint}Known parts: {known_devices()}. Pass the exact "
                     "part (e.g. 'H100-SXM'), or give peak_flops= yourself, or measure it with "
                     "labkit.hardware.measure_matmul_peak().")


@dataclass(frozen=True)
class DeviceFamily:
    """The catalogued parts one name matches: one part for an exact name, several for a family name.

    Taught in chapter 4 (MFU and HFU).
    """

    name: str
    parts: tuple

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def peak(self, dtype: str) -> float:
        """The parts' common peak for ``dtype`` (keys as :meth:`DeviceSpec.peak`); when they differ, or
        some lack it, a ValueError listing every part with its figure. Taught in chapter 4."""
        key = _peak_key(dtype)
        figures = {p.name: p.peak_flops.get(key) for p in self.parts}
        values = set(figures.values())
        if len(values) == 1 and None not in values:
            return values.pop()
        shown = ", ".join(f"{n} {v / TERA:g} TFLOP/s" if v is not None else f"{n} (none)"
                          for n, v in figures.items())
        raise ValueError(f"name={self.name!r}, dtype={dtype!r}: its {len(self.parts)} parts have different "
                         f"{key} peaks: {shown}. Name the exact part (e.g. {self.parts[0].name!r}) or give "
                         "peak_flops= yourself.")


def family(name: str) -> DeviceFamily:
    """All parts ``name`` matches: the exact part (as :func:`lookup`), else every part whose name or an
    alias holds all of its tokens ("A100" -> four parts, "V100 SXM2" -> two); none raises as
    :func:`lookup`. Taught in chapter 4 (MFU and HFU).
    """
    key = _check_name(name)
    if key in _ALIAS_INDEX:
        return DeviceFamily(name, (CATALOGUE[_ALIAS_INDEX[key]],))
    parts = _family_parts(key)
    if not parts:
        lookup(name)            # raises, listing the near candidates and the known parts
    return DeviceFamily(name, tuple(parts))


def lookup_peak(name: str, dtype: str) -> float:
    """Peak FLOP/s of a part or a family for ``dtype`` (dense for a dtype): ``lookup_peak("A100", "bf16")``
    is 312e12 because all four A100s agree; ``lookup_peak("H100", "bf16")`` raises listing SXM, PCIe and
    NVL with their figures. Taught in chapter 4 (MFU and HFU).
    """
    return family(name).peak(dtype)
