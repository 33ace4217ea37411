"""Library dispatch for the TVM emitter's CUDA builds: GEMMs (with their bias / activation /
residual epilogue) and attention run Triton kernels (``targets/tvm/triton_kernels.py``) compiled
ahead of time and embedded in the artifact.

How a kernel gets into a TVM artifact (the route of TVM's own ``T.call_kernel``,
``tvm.tirx.script.builder.external_kernel``, with an explicit compute capability so nothing asks
the local driver):

1. :class:`TritonLibrary` compiles a kernel specialization with ``triton.compiler.compile`` for
   ``GPUTarget("cuda", 90, 32)`` and renames its PTX entry (every specialization of one
   ``@triton.jit`` function has the same name, and TVM looks kernels up by name).
2. A host-only PrimFunc (:func:`launcher`) calls it with ``T.call_packed(name, pointers...,
   threads, grid x/y/z[, dynamic shared memory])``; Relax calls that PrimFunc with ``call_tir``.
3. The PTX goes into a ``cuda`` runtime module (``ffi.Module.create.cuda``) listed in the
   IRModule's ``external_mods``; ``tvm.compile`` imports it into the library, and
   ``export_library`` saves it inside ``model.so``. The CUDA driver JIT-compiles the PTX at load.

Step 3 needs TVM's CUDA runtime (a machine with the CUDA driver); :func:`available` says whether
all steps can run here.
"""

from __future__ import annotations

import json
import logging
import math
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
                     constexprs: Callable[[Dict[str, int]], Dict[str, Any]], first: Dict[str, int],
                     candidates: Sequence[Dict[str, int]], what: str) -> Tuple[Kernel, Dict[str, int]]:
    """Compile configuration ``first`` or, when it needs more shared memory than the device has,
    the same tiles with fewer pipeline stages, then the other candidates in order (as Triton's
    autotuner drops configurations that do not fit); returns the kernel and its configuration.

    Raises:
        ValueError: no candidate fits the device's shared memory.
    """
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


# -- GEMM ------------------------------------------------------------------------------------

def _gemm_candidates(dtype: str, precision: str) -> List[Dict[str, int]]:
    # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), largest tile first: without tuning the first
    # whose grid fills the SMs is taken
    if dtype == "float32" and precision == "ieee":
        tiles = [(128, 128, 32, 8, 3), (128, 128, 16, 8, 3), (128, 64, 32, 8, 3), (64, 128, 32, 4, 3),
                 (64, 64, 32, 4, 3), (64, 64, 16, 4, 4), (32, 64, 32, 4, 3)]
    elif dtype == "float32":
        tiles = [(128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 64, 32, 4, 4), (64, 128, 32, 4, 3)]
    else:
        tiles = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 64, 64, 4, 4),
                 (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]
    return [{"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": s}
            for m, n, k, w, s in tiles]


@dataclass(frozen=True)
class GemmSpec:
    """``C[z] = act(A[z] @ B + bias) + R[z]`` with A [Z, M, K] and B [K, N] (``b_transposed``:
    B is stored [N, K]); dtypes all ``dtype``."""

    z: int
    m: int
    n: int
    k: int
    dtype: str
    b_transposed: bool = False
    bias: bool = False
    act: int = 0
    residual: bool = False

    def label(self) -> str:
        from passctl.targets.tvm.triton_kernels import ACT_GELU, ACT_GELU_TANH, ACT_RELU

        parts = [f"gemm {self.z * self.m}x{self.k}x{self.n} {self.dtype}"]
        if self.b_transposed:
            parts.append("B^T")
        if self.bias:
            parts.append("+bias")
        parts += [{ACT_GELU: "gelu", ACT_GELU_TANH: "gelu_tanh", ACT_RELU: "relu"}.get(self.act, "")]
        if self.residual:
            parts.append("+residual")
        return " ".join(p for p in parts if p)


def gemm_kernel_for(lib: TritonLibrary, spec: GemmSpec) -> Tuple[Kernel, Tuple[int, int, int]]:
    """Compile the GEMM kernel for ``spec``; returns it and its grid.

    Raises:
        ValueError: no tile configuration fits the device's shared memory.
    """
    from passctl.targets.tvm.triton_kernels import gemm_kernel

    precision = "none" if spec.dtype != "float32" else lib.fp32_precision
    m = spec.z * spec.m  # rows of every z are contiguous: one [Z*M, K] GEMM
    sbk, sbn = (1, spec.k) if spec.b_transposed else (spec.n, 1)

    def constexprs(c):
        return {"M": m, "N": spec.n, "K": spec.k, "stride_am": spec.k, "stride_ak": 1,
                "stride_bk": sbk, "stride_bn": sbn, "stride_ab": 0, "stride_bb": 0,
                "HAS_BIAS": spec.bias, "ACT": spec.act, "HAS_RES": spec.residual,
                "PRECISION": precision, "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"],
                "BLOCK_K": c["BLOCK_K"], "GROUP_M": 8}

    def grid_of(c):
        return _cdiv(m, c["BLOCK_M"]) * _cdiv(spec.n, c["BLOCK_N"])

    def bench(c):
        import torch
        import triton.testing

        dt = getattr(torch, spec.dtype)
        a = torch.randn(m, spec.k, device="cuda", dtype=dt)
        b = torch.randn(*((spec.n, spec.k) if spec.b_transposed else (spec.k, spec.n)),
                        device="cuda", dtype=dt)
        bias = torch.randn(spec.n, device="cuda", dtype=dt)
        out = torch.empty(m, spec.n, device="cuda", dtype=dt)
        args = constexprs(c)
        run = lambda: gemm_kernel[(grid_of(c), 1)](a, b, bias, out, out, **args,  # noqa: E731
                                                   num_warps=c["num_warps"],
                                                   num_stages=c["num_stages"])
        return triton.testing.do_bench(run, warmup=5, rep=20)

    c = lib._pick(_gemm_candidates(spec.dtype, precision), grid_of, bench)
    pointers = {p: spec.dtype for p in ("a_ptr", "b_ptr", "bias_ptr", "res_ptr", "c_ptr")}
    kernel, c = _compile_fitting(lib, gemm_kernel, pointers, constexprs, c,
                                 _gemm_candidates(spec.dtype, precision), spec.label())
    return kernel, (grid_of(c), 1, 1)


# -- attention -------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionSpec:
    """Q [B, H, S, D], K [B, KVH, T, D], V [B, KVH, T, DV], optional mask [mb, mh, S, T]
    (``mask_shape`` is its full 4-d broadcast shape; ``mask_kind`` 0 none, 1 additive, 2 boolean).
    ``bshd``: for Q, K, V, whether the buffer is stored [B, S, H, D] (read in place) rather than
    [B, H, S, D]."""

    b: int
    h: int
    kvh: int
    s: int
    t: int
    d: int
    dv: int
    dtype: str
    scale: float
    mask_kind: int = 0
    mask_shape: Tuple[int, ...] = ()
    mask_dtype: str = ""
    causal: bool = False
    nan_to_zero: bool = False
    bshd: Tuple[bool, bool, bool] = (False, False, False)


def _strides(heads: int, seq: int, dim: int, bshd: bool) -> Tuple[int, int, int]:
    """(batch, head, sequence) strides of a contiguous [B, H, S, D] or, ``bshd``, [B, S, H, D]."""
    return (seq * heads * dim, dim, heads * dim) if bshd else (heads * seq * dim, seq * dim, dim)


def _attention_candidates(d: int) -> List[Dict[str, int]]:
    if d <= 64:
        tiles = [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)]
    else:
        tiles = [(128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3)]
    return [{"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s} for m, n, w, s in tiles]


def attention_kernel_for(lib: TritonLibrary, spec: AttentionSpec) -> Tuple[Kernel, Tuple[int, int, int]]:
    """Compile the FlashAttention kernel for ``spec``; returns it and its grid.

    Raises:
        ValueError: the mask broadcasts over the key axis, or no tile configuration fits the
            device's shared memory (the caller falls back to TVM's kernels).
    """
    from passctl.targets.tvm.triton_kernels import attention_kernel

    if spec.mask_kind:
        mb, mh, ms, mt = spec.mask_shape
        smb, smh, sms = (mh * ms * mt if mb > 1 else 0, ms * mt if mh > 1 else 0,
                         mt if ms > 1 else 0)
        if mt != spec.t:  # the key axis must be materialized (unit stride over T)
            raise ValueError("attention mask broadcasts over the key axis")
    else:
        smb = smh = sms = 0

    def constexprs(c):
        sqb, sqh, sqs = _strides(spec.h, spec.s, spec.d, spec.bshd[0])
        skb, skh, sks = _strides(spec.kvh, spec.t, spec.d, spec.bshd[1])
        svb, svh, svs = _strides(spec.kvh, spec.t, spec.dv, spec.bshd[2])
        return {"H": spec.h, "GROUP": spec.h // spec.kvh, "S": spec.s, "T": spec.t, "D": spec.d,
                "DV": spec.dv, "sqb": sqb, "sqh": sqh, "sqs": sqs, "skb": skb, "skh": skh,
                "sks": sks, "svb": svb, "svh": svh, "svs": svs,
                "smb": smb, "smh": smh, "sms": sms, "SCALE": float(spec.scale),
                "MASK": spec.mask_kind, "CAUSAL": spec.causal, "NAN_TO_ZERO": spec.nan_to_zero,
                "PRECISION": "none" if spec.dtype != "float32" else lib.fp32_precision,
                "BLOCK_M": c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"],
                "BLOCK_D": max(16, 1 << (spec.d - 1).bit_length()),
                "BLOCK_DV": max(16, 1 << (spec.dv - 1).bit_length())}

    def grid_of(c):
        return _cdiv(spec.s, c["BLOCK_M"]) * spec.b * spec.h

    def bench(c):
        import torch
        import triton.testing

        dt = getattr(torch, spec.dtype)
        q = torch.randn(spec.b, spec.h, spec.s, spec.d, device="cuda", dtype=dt)
        k = torch.randn(spec.b, spec.kvh, spec.t, spec.d, device="cuda", dtype=dt)
        v = torch.randn(spec.b, spec.kvh, spec.t, spec.dv, device="cuda", dtype=dt)
        q, k, v = (x.transpose(1, 2).contiguous() if t else x for x, t in zip((q, k, v), spec.bshd))
        o = torch.empty(spec.b, spec.h, spec.s, spec.dv, device="cuda", dtype=dt)
        mask = (torch.zeros(spec.mask_shape, device="cuda",
                            dtype=getattr(torch, spec.mask_dtype)) if spec.mask_kind else o)
        args = constexprs(c)
        run = lambda: attention_kernel[(_cdiv(spec.s, c["BLOCK_M"]), spec.b * spec.h)](  # noqa: E731
            q, k, v, mask, o, **args, num_warps=c["num_warps"], num_stages=c["num_stages"])
        return triton.testing.do_bench(run, warmup=5, rep=20)

    c = lib._pick(_attention_candidates(spec.d), grid_of, bench)
    pointers = {"q_ptr": spec.dtype, "k_ptr": spec.dtype, "v_ptr": spec.dtype,
                "mask_ptr": spec.mask_dtype if spec.mask_kind else spec.dtype, "o_ptr": spec.dtype}
    what = (f"attention B{spec.b} H{spec.h}/{spec.kvh} S{spec.s} T{spec.t} D{spec.d} {spec.dtype}"
            + (" causal" if spec.causal else "") + (" +mask" if spec.mask_kind else "")
            + (" BSHD in" if any(spec.bshd) else ""))
    kernel, c = _compile_fitting(lib, attention_kernel, pointers, constexprs, c,
                                 _attention_candidates(spec.d), what)
    return kernel, (_cdiv(spec.s, c["BLOCK_M"]), spec.b * spec.h, 1)


# -- TIR launchers ---------------------------------------------------------------------------

def launcher(kernel: Kernel, buffers: Sequence[Tuple[Sequence[int], str]],
             pointer_buffers: Sequence[int], grid: Tuple[int, int, int]):
    """A host PrimFunc (``call_tir`` target) that launches ``kernel``.

    Args:
        buffers: ``(shape, dtype)`` of each PrimFunc parameter (the call_tir inputs, then its
            output).
        pointer_buffers: for each kernel pointer parameter, the index of the buffer it points at
            (an unused pointer, like an absent bias, may point at any buffer).
        grid: blocks in x, y, z.
    """
    import tvm.script

    lines = ["# from tvm.script import tirx as T", "@T.prim_func",
             f"def {kernel.name}_launch({', '.join(f'a{i}: T.handle' for i in range(len(buffers)))}):",
             '    T.func_attr({"tir.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})']
    for i, (shape, dtype) in enumerate(buffers):
        dims = ", ".join(str(int(x)) for x in shape) + ("," if len(shape) == 1 else "")
        lines.append(f'    B{i} = T.match_buffer(a{i}, ({dims}), "{dtype}")')
    args = [f'"{kernel.name}"'] + [f"B{i}.data" for i in pointer_buffers]
    args += ["T.int64(0)"] * kernel.hidden
    args += [f"T.int32({x})" for x in (kernel.threads, *grid)]
    if kernel.shared:
        args.append(f"T.int32({kernel.shared})")
    lines.append(f"    T.call_packed({', '.join(args)})")
    func = tvm.script.from_source("\n".join(lines) + "\n")
    return func.with_attr("global_symbol", kernel.name + "_launch")


def call_gemm(bb, lib: TritonLibrary, a, b, bias=None, act: int = 0, residual=None,
              b_transposed: bool = False):
    """Emit ``call_tir`` of a Triton GEMM: ``act(a @ b + bias) + residual``.

    Args:
        a: Relax expr [..., M, K] (contiguous; the leading axes are flattened into M).
        b: Relax expr [K, N], or [N, K] with ``b_transposed``.
        bias: [N] (or any shape with N elements) or None; residual: a's shape with N last, or None.
    """
    from tvm import relax

    a_shape = [int(x) for x in a.ty.shape]
    b_shape = [int(x) for x in b.ty.shape]
    n = b_shape[0] if b_transposed else b_shape[1]
    k = a_shape[-1]
    dtype = str(a.ty.dtype)
    m = math.prod(a_shape[:-1])
    spec = GemmSpec(1, m, n, k, dtype, b_transposed, bias is not None, act, residual is not None)
    kernel, grid = gemm_kernel_for(lib, spec)
    out_shape = a_shape[:-1] + [n]
    inputs = [a, b] + ([bias] if bias is not None else []) + ([residual] if residual is not None
                                                              else [])
    buffers = [([int(x) for x in e.ty.shape], str(e.ty.dtype)) for e in inputs] + [(out_shape, dtype)]
    out = len(inputs)
    pointers = [0, 1, 2 if bias is not None else out,
                (3 if bias is not None else 2) if residual is not None else out, out]
    gv = bb.add_func(launcher(kernel, buffers, pointers, grid), kernel.name + "_launch")
    return relax.call_tir(gv, relax.Tuple(inputs), relax.TensorType(out_shape, dtype))


def call_attention(bb, lib: TritonLibrary, q, k, v, mask, attrs: Dict[str, Any]):
    """Emit ``call_tir`` of the Triton FlashAttention kernel for one ``passctl::Attention``
    (BHSD in and out; schema: passes/attention/canonical.py).

    Raises:
        ValueError: a mask that broadcasts over the key axis or has rank > 4 (the caller falls
            back to TVM's kernels).
    """
    from tvm import relax

    def text(x):
        return x.decode() if isinstance(x, bytes) else str(x)

    qs, ks, vs = ([int(x) for x in e.ty.shape] for e in (q, k, v))
    dtype = str(q.ty.dtype)
    # Q / K / V that are permute_dims(x, [0, 2, 1, 3]) of a [B, S, H, D] x: read x in place
    sources, bshd = [], []
    for e in (q, k, v):
        src = e
        if isinstance(e, relax.Var):
            src = bb.lookup_binding(e) or e
        if (isinstance(src, relax.Call) and getattr(src.op, "name", "") == "relax.permute_dims"
                and src.attrs.axes is not None and [int(a) for a in src.attrs.axes] == [0, 2, 1, 3]):
            sources.append(src.args[0])
            bshd.append(True)
        else:
            sources.append(e)
            bshd.append(False)
    kind = {"none": 0, "additive": 1, "boolean": 2}[text(attrs.get("mask_kind", "none"))]
    mask_shape: Tuple[int, ...] = ()
    inputs = list(sources)
    if mask is not None and kind:
        ms = [int(x) for x in mask.ty.shape]
        if len(ms) > 4:
            raise ValueError("attention mask of rank > 4")
        mask_shape = tuple([1] * (4 - len(ms)) + ms)
        inputs.append(mask)
    else:
        kind = 0
    spec = AttentionSpec(qs[0], qs[1], ks[1], qs[2], ks[2], qs[3], vs[3], dtype,
                         float(attrs["scale"]), kind, mask_shape,
                         str(mask.ty.dtype) if kind else "", bool(int(attrs.get("is_causal", 0)))
                         and not kind, bool(int(attrs.get("nan_to_zero", 0))), tuple(bshd))
    kernel, grid = attention_kernel_for(lib, spec)
    out_shape = [qs[0], qs[1], qs[2], vs[3]]
    buffers = [([int(x) for x in e.ty.shape], str(e.ty.dtype)) for e in inputs] + [(out_shape, dtype)]
    out = len(inputs)
    pointers = [0, 1, 2, 3 if kind else out, out]
    gv = bb.add_func(launcher(kernel, buffers, pointers, grid), kernel.name + "_launch")
    return relax.call_tir(gv, relax.Tuple(inputs), relax.TensorType(out_shape, dtype))


def _is_call(expr, name: str) -> bool:
    from tvm import relax

    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == name


def _static_shape(expr) -> Optional[List[int]]:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    try:
        return [int(x) for x in shape] if shape is not None else None
    except (TypeError, ValueError):
        return None


def dispatch_gemms(mod, lib: TritonLibrary):
    """Rewrite ``main``'s matmuls with a 2-d right operand into Triton GEMM ``call_tir``s, taking
    along the epilogue that follows each one when the matmul's result has no other use: an
    ``add`` of an [N] bias, then ``nn.gelu`` / ``nn.gelu_tanh`` / ``nn.relu``, and an ``add`` of a
    residual of the output's shape (in either order when there is no activation). A right
    operand ``permute_dims(W, [1, 0])`` is read transposed in place.

    Only float16 / bfloat16 / float32 matmuls of static shape whose output dtype is the inputs'
    are taken; the rest stay with TVM's kernels.

    Returns:
        ``(mod, count)``: the rewritten module (dead bindings removed) and the GEMMs dispatched.
    """
    from collections import defaultdict

    from tvm import relax

    from passctl.targets.tvm.triton_kernels import ACT_GELU, ACT_GELU_TANH, ACT_RELU

    acts = {"relax.nn.gelu": ACT_GELU, "relax.nn.gelu_tanh": ACT_GELU_TANH, "relax.nn.relu": ACT_RELU}
    func = mod["main"]
    bindings = [bd for block in func.body.blocks for bd in block.bindings
                if isinstance(bd, relax.VarBinding)]
    value_of = {bd.var: bd.value for bd in bindings}
    consumers: Dict[Any, List[Any]] = defaultdict(list)
    for bd in bindings:
        for v in relax.analysis.free_vars(bd.value):
            consumers[v].append(bd)
    for v in relax.analysis.free_vars(func.body.body):
        consumers[v].append(None)

    plan: Dict[Any, Tuple] = {}
    for bd in bindings:
        val = bd.value
        if not _is_call(val, "relax.matmul") or len(val.args) != 2:
            continue
        a, b = val.args
        a_shape, b_shape, out_shape = _static_shape(a), _static_shape(b), _static_shape(bd.var)
        dtype = str(getattr(a.ty, "dtype", ""))
        if (a_shape is None or b_shape is None or out_shape is None or len(a_shape) < 2
                or len(b_shape) != 2 or dtype not in ("float16", "bfloat16", "float32")
                or str(b.ty.dtype) != dtype or str(bd.var.ty.dtype) != dtype):
            continue
        n = b_shape[1]
        b_src, transposed = b, False
        src = value_of.get(b)
        if (src is not None and _is_call(src, "relax.permute_dims")
                and (src.attrs.axes is None  # no perm: axes reversed, [1, 0] for 2-d
                     or [int(x) for x in src.attrs.axes] == [1, 0])
                and _static_shape(src.args[0]) is not None):
            b_src, transposed = src.args[0], True
        cur, bias, act, res = bd.var, None, 0, None
        while len(consumers[cur]) == 1 and consumers[cur][0] is not None:
            nxt = consumers[cur][0]
            nv = nxt.value
            if _is_call(nv, "relax.add") and len(nv.args) == 2:
                other = nv.args[1] if nv.args[0].same_as(cur) else nv.args[0]
                if other.same_as(cur) or not (nv.args[0].same_as(cur) or nv.args[1].same_as(cur)):
                    break
                oshape = _static_shape(other)
                if oshape is None or str(other.ty.dtype) != dtype or _static_shape(nxt.var) != out_shape:
                    break
                if bias is None and res is None and math.prod(oshape) == n and oshape[-1] == n:
                    bias = other
                elif res is None and oshape == out_shape:
                    res = other
                elif bias is None and act == 0 and math.prod(oshape) == n and oshape[-1] == n:
                    bias = other
                else:
                    break
            elif (getattr(getattr(nv, "op", None), "name", None) in acts and bias is not None
                  and res is None and act == 0):
                act = acts[nv.op.name]
            else:
                break
            cur = nxt.var
        plan[cur] = (a, b_src, transposed, bias, act, res)

    if not plan:
        return mod, 0

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            if binding.var in plan:
                a, b, transposed, bias, act, res = plan[binding.var]
                try:
                    new = call_gemm(self.builder_, lib, self.visit_expr(a), self.visit_expr(b),
                                    None if bias is None else self.visit_expr(bias), act,
                                    None if res is None else self.visit_expr(res), transposed)
                except ValueError as e:  # no tile fits the device: the chain stays with TVM
                    logger.info("GEMM on TVM kernels: %s", e)
                    skipped.append(binding.var)
                    super().visit_var_binding_(binding)
                    return
                # same shape and dtype as the binding's var: keep the var, so its uses stand
                self.builder_.emit_normalized(relax.VarBinding(binding.var,
                                                               self.builder_.normalize(new)))
                return
            super().visit_var_binding_(binding)

    skipped: List[Any] = []
    rewriter = _Rewriter(mod)
    new_main = rewriter.visit_expr(func)
    out = rewriter.builder_.get()
    out["main"] = new_main
    out = relax.transform.DeadCodeElimination(["main"])(out)
    return out, len(plan) - len(skipped)


__all__ = ["AttentionSpec", "GemmSpec", "Kernel", "MAX_SHARED_BYTES", "SharedMemoryError",
           "TritonLibrary", "attention_kernel_for", "available", "call_attention", "call_gemm",
           "dispatch_gemms", "gemm_kernel_for", "launcher"]
