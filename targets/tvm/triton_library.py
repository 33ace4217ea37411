"""Triton kernel specializations compiled ahead of time for one CUDA compute capability (PTX
for the TVM emitter's library dispatch, :mod:`passctl.targets.tvm.triton_dispatch`)."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from passctl.ir.errors import UserError

logger = logging.getLogger(__name__)

#: numpy / Relax dtype name -> Triton pointer element type.
_TRITON_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "bool": "i1",
                 "int8": "i8", "uint8": "u8", "int32": "i32", "int64": "i64"}


#: Most dynamic shared memory one thread block may use (opt-in), bytes, per compute capability
#: (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"); others: 48 KiB.
MAX_SHARED_BYTES = {(7, 0): 96 * 1024, (7, 2): 96 * 1024, (7, 5): 64 * 1024, (8, 0): 163 * 1024,
                    (8, 6): 99 * 1024, (8, 7): 163 * 1024, (8, 9): 99 * 1024, (9, 0): 227 * 1024,
                    (10, 0): 227 * 1024, (12, 0): 99 * 1024}


class SharedMemoryError(RuntimeError):
    """A kernel specialization needs more shared memory per block than its compute capability
    has (it would fail at launch); Triton only checks this against a local GPU.

    Attributes:
        shared: the bytes it needs.
    """

    def __init__(self, message: str, shared: int):
        super().__init__(message)
        self.shared = shared


def available() -> Tuple[bool, str]:
    """Whether Triton kernels can be embedded here: ``(ok, reason when not)``.

    Needs ``triton`` >= 3.3 (compiles the kernels) and TVM's CUDA runtime
    (``ffi.Module.create.cuda``, present where the CUDA driver is).
    """
    try:
        import triton
    except ImportError:
        return False, "triton is not installed (pip install triton)"
    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    if (major, minor) < (3, 3):
        return False, f"triton {triton.__version__} is older than 3.3"
    import tvm_ffi

    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        return False, "TVM's CUDA runtime is not loaded (no CUDA driver on this machine)"
    return True, ""


@dataclass(frozen=True)
class Kernel:
    """One compiled kernel specialization.

    Attributes:
        name: its entry symbol in the PTX (unique within a :class:`TritonLibrary`).
        ptx: the PTX text.
        pointer_params: names of the kernel's pointer parameters, in order.
        hidden: trailing pointer parameters Triton adds (global / profile scratch), passed as 0.
        threads: threads per block (``num_warps * 32``).
        shared: dynamic shared memory per block, bytes.
        config: the tile configuration it was compiled with.
    """

    name: str
    ptx: str
    pointer_params: Tuple[str, ...]
    hidden: int
    threads: int
    shared: int
    config: Dict[str, int] = field(hash=False, compare=False)


def _entry_params(ptx: str, name: str) -> int:
    match = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if match is None:
        raise RuntimeError(f"Triton's PTX has no entry '{name}'")
    return match.group(1).count(".param")


class TritonLibrary:
    """Triton kernel specializations compiled for one CUDA compute capability.

    Args:
        compute_capability: ``(major, minor)``, e.g. ``(9, 0)``.
        sm_count: streaming multiprocessors on the device (grid-size heuristics).
        tune: time the candidate tile configurations on the local GPU (needs torch with CUDA) and
            keep the fastest, like TensorRT's tactic selection; otherwise a heuristic picks one.
        fp32_precision: ``tl.dot``'s input precision for float32 GEMMs and attention:
            ``"ieee"`` (fp32 FMA on CUDA cores), ``"tf32"`` (tensor cores, inputs rounded to a
            10-bit mantissa: a precision change) or ``"tf32x3"`` (tensor cores, each input split
            into a TF32 high and low part and three products summed: about 21 mantissa bits, the
            error-compensated "3xTF32" of CUTLASS / Ootomo & Yokota 2022).

    Attributes:
        max_shared: shared memory per block the device allows, bytes (:data:`MAX_SHARED_BYTES`);
            a specialization needing more is not compiled (:func:`_compile_fitting` picks
            another configuration).
    """

    def __init__(self, compute_capability: Tuple[int, int], sm_count: int = 0,
                 tune: bool = False, fp32_precision: str = "ieee"):
        if fp32_precision not in ("ieee", "tf32", "tf32x3"):
            raise UserError(f"fp32 GEMM precision '{fp32_precision}': use 'ieee', 'tf32' or "
                            "'tf32x3'")
        self.cc = tuple(compute_capability)
        self.max_shared = MAX_SHARED_BYTES.get(self.cc, 48 * 1024)
        self.sm_count = sm_count or 100
        self.tune = tune
        self.fp32_precision = fp32_precision
        self.kernels: Dict[Any, Kernel] = {}
        #: (kernel, grid) by ("gemm" | "attention", spec) (triton_specs._once)
        self.specialized: Dict[Any, Tuple[Kernel, Tuple[int, int, int]]] = {}
        #: launcher PrimFuncs by (kernel, buffers, pointers, grid) (triton_dispatch._call_kernel)
        self.launchers: Dict[Any, Any] = {}
        self.log: List[Dict[str, Any]] = []  # one entry per specialization, for the manifest

    # -- compilation -------------------------------------------------------------------------

    def compile(self, fn, pointers: Dict[str, str], constexprs: Dict[str, Any],
                num_warps: int, num_stages: int, what: str) -> Kernel:
        """Compile ``fn`` with pointer parameters of the given dtypes and constants.

        Args:
            fn: a ``@triton.jit`` function whose non-pointer parameters are all ``tl.constexpr``.
            pointers: pointer parameter name -> element dtype (``"float16"``).
            constexprs: every constexpr parameter's value.
            what: a label for the manifest (``"gemm 1024x768x3072 float16 +bias gelu"``).

        Raises:
            SharedMemoryError: the kernel needs more shared memory per block than
                :data:`MAX_SHARED_BYTES` allows for this compute capability.
            RuntimeError: Triton rejects the specialization (the kernel needs global scratch
                memory, or compilation fails).
        """
        import triton
        from triton.backends.compiler import GPUTarget

        key = (fn.__name__, tuple(sorted(pointers.items())), tuple(sorted(constexprs.items())),
               num_warps, num_stages)
        if key in self.kernels:
            return self.kernels[key]
        signature, attrs, pointer_params = {}, {}, []
        for i, param in enumerate(fn.params):
            if param.name in pointers:
                signature[param.name] = "*" + _TRITON_TYPES[pointers[param.name]]
                attrs[(i,)] = [["tt.divisibility", 16]]  # TVM buffers are >= 64-byte aligned
                pointer_params.append(param.name)
            else:
                signature[param.name] = "constexpr"
        source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=dict(constexprs),
                                           attrs=attrs)
        compiled = triton.compiler.compile(
            source, target=GPUTarget("cuda", self.cc[0] * 10 + self.cc[1], 32),
            options={"num_warps": num_warps, "num_stages": num_stages})
        meta = compiled.metadata
        if getattr(meta, "global_scratch_size", 0) or getattr(meta, "num_ctas", 1) != 1:
            raise RuntimeError(f"{what}: Triton kernel needs global scratch or clusters")
        if int(meta.shared) > self.max_shared:
            raise SharedMemoryError(f"{what}: {int(meta.shared)} bytes of shared memory per block, "
                                    f"sm_{self.cc[0]}{self.cc[1]} has {self.max_shared}",
                                    int(meta.shared))
        name = f"passctl_{fn.__name__}_{len(self.kernels)}"
        ptx = re.sub(r"\b" + re.escape(compiled.name) + r"\b", name, compiled.asm["ptx"])
        hidden = _entry_params(ptx, name) - len(pointer_params)
        kernel = Kernel(name, ptx, tuple(pointer_params), hidden, num_warps * 32,
                        int(meta.shared), {"num_warps": num_warps, "num_stages": num_stages,
                                           **{k: v for k, v in constexprs.items()
                                              if k.startswith("BLOCK") or k == "GROUP_M"}})
        self.kernels[key] = kernel
        self.log.append({"kernel": name, "what": what, "config": kernel.config,
                         "shared_bytes": kernel.shared})
        return kernel

    def modules(self) -> List[Any]:
        """One TVM ``cuda`` runtime module per compiled kernel (for ``external_mods``).

        Raises:
            UserError: TVM's CUDA runtime is not loaded here (see :func:`available`).
        """
        import tvm_ffi

        create = tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True)
        if create is None:
            raise UserError("embedding Triton kernels needs TVM's CUDA runtime (a machine with the "
                            "CUDA driver); build with kernels='tvm' to cross-compile DLight "
                            "kernels only")
        import tvm

        load_meta = tvm_ffi.get_global_func("runtime.LoadMetaDataFromJSON")
        mods = []
        for k in self.kernels.values():
            tags = ["threadIdx.x", "blockIdx.x", "blockIdx.y", "blockIdx.z"]
            if k.shared:
                tags.append("tirx.use_dyn_shared_memory")
            meta = {"tvm_version": tvm.__version__, "func_info": {k.name: {
                "name": "", "arg_types": ["handle"] * len(k.pointer_params) + ["int64"] * k.hidden,
                "launch_param_tags": tags}}}
            mods.append(create(k.ptx.encode(), "ptx", load_meta(json.dumps(meta)), {}))
        return mods

    # -- tile configurations -----------------------------------------------------------------

    def _pick(self, candidates: Sequence[Dict[str, int]], grid_of: Callable[[Dict[str, int]], int],
              bench: Optional[Callable[[Dict[str, int]], float]]) -> Dict[str, int]:
        """The fastest candidate by ``bench`` (ms) when tuning, else the first whose grid fills
        the SMs (the last when none does)."""
        if self.tune and bench is not None:
            timed = []
            for c in candidates:
                try:
                    timed.append((bench(c), c))
                except Exception as e:  # a candidate that does not compile or fit is skipped
                    logger.debug("candidate %s failed: %s", c, e)
            if timed:
                return min(timed, key=lambda t: t[0])[1]
        for c in candidates:
            if grid_of(c) >= self.sm_count:
                return c
        return candidates[-1]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _compile_fitting(lib: TritonLibrary, fn, pointers: Dict[str, str],
                     constexprs: Callable[[Dict[str, int]], Dict[str, Any]],
                     candidates: Sequence[Dict[str, int]],
                     grid_of: Callable[[Dict[str, int]], int],
                     bench: Optional[Callable[[Dict[str, int]], float]],
                     what: str) -> Tuple[Kernel, Dict[str, int]]:
    """Compile the candidate :meth:`TritonLibrary._pick` chooses (``grid_of`` / ``bench`` as
    there) or, when it needs more shared memory than the device has, the same tiles with fewer
    pipeline stages, then the other candidates in order (as Triton's autotuner drops
    configurations that do not fit); returns the kernel and its configuration.

    Raises:
        ValueError: no candidate fits the device's shared memory.
    """
    first = lib._pick(candidates, grid_of, bench)
    for c in [first] + [x for x in candidates if x != first]:
        needed = None
        for stages in range(c["num_stages"], 0, -1):
            config = dict(c, num_stages=stages)
            try:
                return lib.compile(fn, pointers, constexprs(config), config["num_warps"], stages,
                                   what), config
            except SharedMemoryError as e:
                logger.debug("%s", e)
                if e.shared == needed:  # fewer stages did not help (no async copies: sm_75)
                    break
                needed = e.shared
    raise ValueError(f"{what}: no tile configuration fits the {lib.max_shared} bytes of shared "
                     f"memory per block of sm_{lib.cc[0]}{lib.cc[1]}")


__all__ = ["Kernel", "MAX_SHARED_BYTES", "SharedMemoryError", "TritonLibrary", "available"]
