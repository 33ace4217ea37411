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

import logging
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from passctl.targets.tvm.build import _is_call
from passctl.targets.tvm.triton_library import (MAX_SHARED_BYTES, Kernel, SharedMemoryError,
                                                TritonLibrary, available)
from passctl.targets.tvm.triton_specs import (AttentionSpec, GemmSpec, attention_kernel_for,
                                              gemm_kernel_for)

logger = logging.getLogger(__name__)


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
    a_shape = [int(x) for x in a.ty.shape]
    b_shape = [int(x) for x in b.ty.shape]
    n = b_shape[0] if b_transposed else b_shape[1]
    k = a_shape[-1]
    dtype = str(a.ty.dtype)
    m = math.prod(a_shape[:-1])
    spec = GemmSpec(1, m, n, k, dtype, b_transposed, bias is not None, act, residual is not None)
    kernel, grid = gemm_kernel_for(lib, spec)
    inputs = [a, b] + ([bias] if bias is not None else []) + ([residual] if residual is not None
                                                              else [])
    out = len(inputs)
    pointers = [0, 1, 2 if bias is not None else out,
                (3 if bias is not None else 2) if residual is not None else out, out]
    return _call_kernel(bb, lib, kernel, grid, inputs, pointers, a_shape[:-1] + [n], dtype)


def call_attention(bb, lib: TritonLibrary, q, k, v, mask, attrs: Dict[str, Any]):
    """Emit ``call_tir`` of the Triton FlashAttention kernel for one ``passctl::Attention``
    (BHSD in and out; schema: dialect/attention.py).

    Raises:
        ValueError: a mask that broadcasts over the key axis or has rank > 4 (the caller falls
            back to TVM's kernels).
    """
    from tvm import relax

    from passctl.targets.tvm.support import attr_text as text

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
    out = len(inputs)
    return _call_kernel(bb, lib, kernel, grid, inputs, [0, 1, 2, 3 if kind else out, out],
                        [qs[0], qs[1], qs[2], vs[3]], dtype)


def _call_kernel(bb, lib: TritonLibrary, kernel: Kernel, grid: Tuple[int, int, int], inputs,
                 pointers: Sequence[int], out_shape: Sequence[int], dtype: str):
    """``call_tir`` of ``kernel``'s launcher on ``inputs`` with one ``out_shape`` / ``dtype``
    output. The launcher PrimFunc is built once per kernel and buffer layout (BERT launches each
    GEMM specialization once per layer) and kept in ``lib.launchers``; ``bb.add_func`` adds it to
    the module once."""
    from tvm import relax

    buffers = tuple((tuple(int(x) for x in e.ty.shape), str(e.ty.dtype)) for e in inputs) + (
        (tuple(int(x) for x in out_shape), dtype),)
    key = (kernel.name, buffers, tuple(pointers), tuple(grid))
    if key not in lib.launchers:
        lib.launchers[key] = launcher(kernel, buffers, pointers, grid)
    gv = bb.add_func(lib.launchers[key], kernel.name + "_launch")
    return relax.call_tir(gv, relax.Tuple(inputs), relax.TensorType(list(out_shape), dtype))


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
