"""The CPU instruction sets passctl compiles for: detection on the build machine, and what int8 needs.

ONNX Runtime's CPU int8 kernels (MLAS) multiply uint8 activations by int8 weights (U8S8). How they
accumulate depends on the instruction set, and on x86 without VNNI the result depends on the
weights' range:

- x86 with AVX-512 VNNI or AVX-VNNI (Cascade Lake, Ice Lake, Alder Lake, Zen 4 and newer) or AMX:
  ``vpdpbusd`` / AMX tiles multiply and add into int32; nothing saturates.
- x86 with AVX2 or AVX-512 but no VNNI (Haswell to Skylake, Zen 1-3): ``vpmaddubsw`` adds each pair
  of adjacent u8 x s8 products into a *saturating int16*. With 8-bit weights a pair reaches
  2 x 255 x 127 = 64770 > 32767 and is clamped, so the fused QLinearConv / QLinearMatMul results
  differ from the QDQ graph's math (measured here on ResNet-50: mean-rel 0.33 instead of 0.036).
  ONNX Runtime's quantization guide ("Quantize ONNX models", *When and why do I need to try U8U8?*)
  names two ways out: 7-bit weights (``reduce_range``) or U8U8. With weight codes in [-63, 63] a
  pair is at most 2 x 255 x 63 = 32130, which fits: exact, at the speed of U8S8. U8U8 is exact
  with 8-bit weights but runs on a 16-bit ``vpmaddwd`` kernel (ResNet-50 on an AVX2 EPYC: 55 ms
  against 38 ms for U8S8 and 77 ms fp32; S8S8 has no fast AVX2 kernel: 87 ms).
- Arm64: NEON widens u8 x s8 products to int16 (255 x 127 fits) and accumulates pairs in int32;
  with the dot-product extension (``asimddp``) ``udot`` / ``sdot`` accumulate in int32. Neither
  saturates. (From MLAS's kernel structure; not measured here, no Arm machine.)

So the cpu target's int8 form keeps 8-bit weights where the kernels cannot saturate and uses 7-bit
weights where they can (:attr:`CpuIsa.u8s8_saturates`).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterable, Optional, Tuple

#: The features passctl looks for, as Linux ``/proc/cpuinfo`` spells them.
KNOWN_FEATURES = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimd",
                  "asimddp")
_VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")

WEIGHT_QMAX_EXACT = 127
"""Weight codes in [-127, 127]: int8 kernels that accumulate in int32 (VNNI, AMX, Arm)."""
WEIGHT_QMAX_NO_SATURATION = 63
"""Weight codes in [-63, 63] (7 bits, ONNX Runtime's ``reduce_range``): a pair of u8 x s8 products
is at most 2 x 255 x 63 = 32130 <= 32767, so ``vpmaddubsw``'s int16 never saturates."""


@dataclass(frozen=True)
class CpuIsa:
    """The instruction set of a CPU target.

    Attributes:
        arch: ``"x86_64"``, ``"aarch64"`` or another ``platform.machine()`` name.
        features: the :data:`KNOWN_FEATURES` the CPU has, sorted.
        name: a short name for reports (``avx2``, ``avx512``, ``vnni``, ``amx``, ``arm64``,
            ``arm64-dotprod``, or the arch alone).
    """

    arch: str
    features: Tuple[str, ...]

    @property
    def name(self) -> str:
        f = set(self.features)
        if self.arch == "x86_64":
            if "amx_int8" in f:
                return "amx"
            if f & {"avx512_vnni", "avx_vnni"}:
                return "vnni"
            if "avx512bw" in f or "avx512f" in f:
                return "avx512"
            return "avx2" if "avx2" in f else "x86_64"
        if self.arch == "aarch64":
            return "arm64-dotprod" if "asimddp" in f else "arm64"
        return self.arch

    @property
    def u8s8_saturates(self) -> bool:
        """Whether ONNX Runtime's U8S8 kernels may clamp pairs of products to int16: x86 without
        VNNI / AMX (see the module docstring)."""
        return self.arch == "x86_64" and not set(self.features) & set(_VNNI)

    @property
    def int8_weight_qmax(self) -> int:
        """Largest weight code of the cpu int8 form on this ISA: 63 where U8S8 saturates, else 127."""
        return WEIGHT_QMAX_NO_SATURATION if self.u8s8_saturates else WEIGHT_QMAX_EXACT

    @property
    def int8_kernels(self) -> str:
        """One line for reports: how ONNX Runtime's int8 kernels accumulate here."""
        if self.u8s8_saturates:
            return "U8S8 with saturating int16 pairs (vpmaddubsw): weights use 7 bits [-63, 63]"
        if self.arch == "x86_64":
            return "U8S8 accumulating in int32 (VNNI vpdpbusd / AMX): weights use 8 bits"
        return "U8S8 accumulating in int32 (NEON / dot product): weights use 8 bits"

    def missing_on(self, host: "CpuIsa") -> Tuple[str, ...]:
        """Features this ISA has that ``host`` lacks (empty when ``host`` runs it as built)."""
        if host.arch != self.arch:
            return (self.arch,)
        return tuple(f for f in self.features if f not in host.features)

    def to_dict(self) -> Dict[str, object]:
        """JSON-ready, for ``report.json`` and ``session.json``."""
        return {"name": self.name, "arch": self.arch, "features": list(self.features),
                "int8_kernels": self.int8_kernels}

    @classmethod
    def from_dict(cls, data: Dict[str, object]) -> "CpuIsa":
        """The inverse of :meth:`to_dict` (``session.json``'s ``target.isa``)."""
        return cls(str(data.get("arch", "")), _known(data.get("features") or ()))


def _known(flags: Iterable[object]) -> Tuple[str, ...]:
    return tuple(sorted({str(f) for f in flags} & set(KNOWN_FEATURES)))


def _linux_flags() -> Optional[Tuple[str, ...]]:
    """The ``flags`` (x86) or ``Features`` (Arm) line of ``/proc/cpuinfo``, or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return tuple(value.split())
    except OSError:
        return None
    return None


def _numpy_flags() -> Tuple[str, ...]:
    """numpy's runtime CPU feature detection, where /proc/cpuinfo is missing (macOS, Windows).

    numpy reports no AVX-VNNI or AMX; those CPUs also have AVX-512 VNNI or are reported as less
    capable (the safe side: 7-bit weights)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as found
    names = {"AVX2": "avx2", "AVX512F": "avx512f", "AVX512BW": "avx512bw",
             "AVX512VNNI": "avx512_vnni", "ASIMD": "asimd", "ASIMDDP": "asimddp"}
    return tuple(ours for theirs, ours in names.items() if found.get(theirs))


def _arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@lru_cache(maxsize=1)
def host_isa() -> CpuIsa:
    """The instruction set of the machine passctl runs on (``/proc/cpuinfo``, else numpy's)."""
    flags = _linux_flags()
    return CpuIsa(_arch(), _known(flags if flags is not None else _numpy_flags()))


#: Named instruction sets for compiling on one machine for another (``--target cpu-<name>``).
NAMED_ISAS: Dict[str, Tuple[str, CpuIsa]] = {
    "avx2": ("x86-64 with AVX2, no VNNI (Haswell to Comet Lake, AMD Zen 1-3)",
             CpuIsa("x86_64", ("avx2",))),
    "avx512": ("x86-64 with AVX-512, no VNNI (Skylake-SP / -X)",
               CpuIsa("x86_64", ("avx2", "avx512bw", "avx512f"))),
    "vnni": ("x86-64 with AVX-512 VNNI (Cascade Lake, Ice Lake, AMD Zen 4 and newer)",
             CpuIsa("x86_64", ("avx2", "avx512_vnni", "avx512bw", "avx512f"))),
    "amx": ("x86-64 with AMX-INT8 (Sapphire Rapids and newer)",
            CpuIsa("x86_64", ("amx_int8", "avx2", "avx512_vnni", "avx512bw", "avx512f"))),
    "arm64": ("Arm64 with NEON", CpuIsa("aarch64", ("asimd",))),
    "arm64-dotprod": ("Arm64 with the dot-product extension (Neoverse, Apple M, Graviton 2+)",
                      CpuIsa("aarch64", ("asimd", "asimddp"))),
}
