"""Target profiles: what passctl knows about each device it compiles for (cpu and NVIDIA GPUs)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from passctl.ir.errors import UserError
from passctl.support.cpu_isa import NAMED_ISAS, CpuIsa, host_isa

#: The reduced-precision dtypes a profile may list as having a fast path.
FAST_DTYPES = ("tf32", "fp16", "bf16", "int8", "fp8")

_GB = 10**9


@dataclass(frozen=True)
class TargetProfile:
    """One compilation target.

    Attributes:
        name: the ``--target`` name (lower case, e.g. ``"a10"``).
        description: one line for ``passctl list-targets``.
        compute_capability: the CUDA compute capability as ``(major, minor)`` (``(8, 6)`` for
            sm_86), or None for the CPU.
        memory_bytes: device memory as marketed (decimal gigabytes, e.g. 24 GB = 24e9 bytes); None
            for the CPU, whose memory is the host's.
        fast_dtypes: reduced-precision dtypes with tensor-core fast paths on this device, a
            subset of :data:`FAST_DTYPES` (NVIDIA architecture whitepapers: Turing adds fp16/int8
            tensor cores, Ampere adds tf32/bf16, Ada and Hopper add fp8). Empty for the CPU
            profiles: their int8 form follows ``isa`` instead.
        default_emitter: the emitter used without ``--emit`` (``"onnxruntime"`` for every
            profile: its artifacts run everywhere; ``tvm`` / ``tensorrt`` are asked for).
        ort_providers: ONNX Runtime execution providers in priority order, CPU last as fallback.
        ort_optional_providers: providers the artifact may use when the runtime has them (the
            TensorRT execution provider on GPUs); listed in ``session.json`` but not enabled.
        sm_count: streaming multiprocessors (SMs) on the device (NVIDIA datasheets: T4 40, A10 72,
            L4 58, A100 108, H100 SXM / H200 132); kernel tile heuristics size their grids by it.
            None for the CPU.
        isa: the instruction set of a CPU profile (``cpu`` is the machine passctl runs on,
            ``cpu-avx2`` ... name one; :mod:`passctl.support.cpu_isa`); None for GPUs.
        memory_bandwidth: peak device memory bandwidth in bytes/s as the NVIDIA datasheet gives
            it (decimal: 3.35 TB/s = 3.35e12), the variant whose SM count the profile has (SXM
            for A100 / H100); what ``passctl generate`` divides the weight bytes read per token
            by. None for the CPU.
    """

    name: str
    description: str
    compute_capability: Optional[Tuple[int, int]]
    memory_bytes: Optional[int]
    fast_dtypes: Tuple[str, ...]
    default_emitter: str = "onnxruntime"
    ort_providers: Tuple[str, ...] = ("CPUExecutionProvider",)
    ort_optional_providers: Tuple[str, ...] = field(default=())
    sm_count: Optional[int] = None
    isa: Optional[CpuIsa] = None
    memory_bandwidth: Optional[float] = None

    @property
    def is_gpu(self) -> bool:
        """True for the CUDA profiles."""
        return self.compute_capability is not None

    @property
    def sm(self) -> Optional[str]:
        """The compute capability as ``"sm_86"``, or None for the CPU."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def supports(self, dtype: str) -> bool:
        """Whether ``dtype`` (one of :data:`FAST_DTYPES`) has a fast path on this target."""
        return dtype in self.fast_dtypes

    def to_dict(self) -> Dict[str, object]:
        """A JSON-ready description (used in ``report.json`` and ``session.json``)."""
        return {
            "name": self.name,
            "description": self.description,
            "compute_capability": self.sm,
            "memory_bytes": self.memory_bytes,
            "fast_dtypes": list(self.fast_dtypes),
            "default_emitter": self.default_emitter,
            "sm_count": self.sm_count,
            "memory_bandwidth": self.memory_bandwidth,
            **({"isa": self.isa.to_dict()} if self.isa is not None else {}),
        }


_GPU_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")
_GPU_OPTIONAL = ("TensorrtExecutionProvider",)


def _gpu(name: str, description: str, cc: Tuple[int, int], gb: int,
         fast: Tuple[str, ...], sms: int, gbps: float) -> TargetProfile:
    return TargetProfile(name, description, cc, gb * _GB, fast, "onnxruntime", _GPU_PROVIDERS,
                         _GPU_OPTIONAL, sms, memory_bandwidth=gbps * _GB)


def _cpu(name: str, description: str, isa: CpuIsa) -> TargetProfile:
    return TargetProfile(name, description, None, None, (), isa=isa)


def _host_cpu() -> TargetProfile:
    """``cpu``: this machine's CPU, its instruction set detected when first asked for."""
    isa = host_isa()
    return _cpu("cpu", f"this machine's CPU ({isa.name}) through ONNX Runtime's CPU execution "
                "provider", isa)


_CPU_NAMED: Dict[str, TargetProfile] = {
    f"cpu-{key}": _cpu(f"cpu-{key}", f"{text} through ONNX Runtime's CPU execution provider", isa)
    for key, (text, isa) in NAMED_ISAS.items()}

#: memory bandwidth (GB/s, the last argument): NVIDIA datasheets: T4 320, A10 600, L4 300,
#: A100 80GB SXM 2039, A100 40GB 1555, H100 SXM 3350, H200 4800 (decimal GB/s).
_GPUS: Dict[str, TargetProfile] = {p.name: p for p in (
    _gpu("t4", "NVIDIA T4 (Turing), 16 GB", (7, 5), 16, ("fp16", "int8"), 40, 320),
    _gpu("a10", "NVIDIA A10 (Ampere), 24 GB", (8, 6), 24, ("tf32", "fp16", "bf16", "int8"), 72,
         600),
    _gpu("l4", "NVIDIA L4 (Ada Lovelace), 24 GB", (8, 9), 24,
         ("tf32", "fp16", "bf16", "int8", "fp8"), 58, 300),
    _gpu("a100", "NVIDIA A100 (Ampere), 80 GB", (8, 0), 80, ("tf32", "fp16", "bf16", "int8"), 108,
         2039),
    _gpu("a100-40gb", "NVIDIA A100 (Ampere), 40 GB", (8, 0), 40,
         ("tf32", "fp16", "bf16", "int8"), 108, 1555),
    _gpu("h100", "NVIDIA H100 (Hopper), 80 GB", (9, 0), 80,
         ("tf32", "fp16", "bf16", "int8", "fp8"), 132, 3350),
    _gpu("h200", "NVIDIA H200 (Hopper), 141 GB", (9, 0), 141,
         ("tf32", "fp16", "bf16", "int8", "fp8"), 132, 4800),
)}


def _profiles() -> Dict[str, TargetProfile]:
    """Every profile by name: ``cpu`` (this machine), the named CPUs, then the GPUs."""
    return {"cpu": _host_cpu(), **_CPU_NAMED, **_GPUS}


def list_targets() -> List[TargetProfile]:
    """Every known target profile: ``cpu`` first, the named CPUs, then GPUs in the order above."""
    return list(_profiles().values())


def get_target(name: str) -> TargetProfile:
    """The profile called ``name`` (case-insensitive).

    Raises:
        UserError: no such target; the message names the closest known targets.
    """
    key = name.strip().lower()
    profiles = _profiles()
    if key in profiles:
        return profiles[key]
    close = difflib.get_close_matches(key, list(profiles), n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise UserError(f"unknown target '{name}': {hint}known targets: {', '.join(profiles)} "
                    "(see `passctl list-targets`)")
