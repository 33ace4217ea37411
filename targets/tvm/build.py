"""The Relax compilation pipelines passctl uses per target (llvm for cpu, cuda for GPUs)."""

from __future__ import annotations

import logging
import math
from typing import List

import numpy as np

from passctl.targets.tvm.support import import_tvm

logger = logging.getLogger(__name__)


def cpu_pipeline(target, schedule: bool = True):
    """The llvm pipeline: TVM's CPU default (library dispatch, LegalizeOps, FuseOps, FuseTIR,
    dataflow lowering, memory planning) plus passctl's CPU schedules of the fused kernels.

    TVM 0.27's ``tvm.compile`` default for llvm legalizes without fusing or scheduling (each op a
    serial loop nest); this pipeline fuses like ``relax.backend.cpu_generic`` and, with
    ``schedule``, applies :mod:`passctl.targets.tvm.cpu_schedule` (parallel outer loops, register
    tiles, vectorized inner loops) to every kernel.
    """
    tvm = import_tvm()
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    passes: List = (cpu_generic.library_dispatch_passes(target)
                    + cpu_generic.legalize_passes(target))
    if schedule:
        from passctl.targets.tvm.cpu_schedule import ScheduleCpuKernels

        passes.append(ScheduleCpuKernels(target))
    passes += cpu_generic.dataflow_lower_passes(target) + cpu_generic.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="passctl_cpu_pipeline")
    def _pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def gpu_pipeline(target, tensorize: bool = True):
    """TVM's CUDA default pipeline: FuseOps/FuseTIR then DLight default GPU schedules (Matmul,
    GEMV, Reduction, GeneralReduction, Fallback). The apache-tvm 0.27 wheel is built without cuBLAS
    and cuDNN (``tvm.support.libinfo()``), so no library dispatch is added.

    Args:
        tensorize: let DLight's Matmul rule use tensor cores (WMMA) for fp16 / int8 matmuls. False
            marks every kernel ``dlight.do_not_tensorize`` first: TVM 0.27's WMMA tensorization
            segfaulted on fp16 matmuls when cross-compiling here (sm_75 to sm_90, no GPU present).
    """
    tvm = import_tvm()
    from tvm import relax

    if tensorize:
        return relax.get_default_pipeline(target)
    from tvm.relax.backend.cuda import pipeline as cuda
    from tvm.s_tir import dlight as dl

    legalize = [p for p in cuda.legalize_passes(target) if not isinstance(p, dl.ApplyDefaultSchedule)]

    @tvm.transform.module_pass(opt_level=0, name="passctl_no_tensorize")
    def _mark(mod, _ctx):
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc):
                mod[gv] = func.with_attr("dlight.do_not_tensorize", True)
        return mod

    schedule = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    passes = (cuda.library_dispatch_passes(target) + legalize + [_mark, schedule]
              + cuda.dataflow_lower_passes(target) + cuda.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="passctl_cuda_pipeline")
    def _pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


TRANSFORM_PARAMS = "main_transform_params"
"""The function LiftTransformParams adds: weights in, weights in the kernels' layout out."""


def compile_module(mod, target, schedule: bool = True, tensorize: bool = True,
                   cuda_graph: bool = False):
    """``tvm.compile`` ``mod`` for ``target`` (a ``tvm.target.Target``) with passctl's pipeline.

    For llvm with ``schedule``, convolutions are first converted to NHWC / HWIO
    (:func:`passctl.targets.tvm.cpu_schedule.conv_layout_pass`) and the weight transposes this
    adds are lifted into :data:`TRANSFORM_PARAMS` (``relax.transform.LiftTransformParams``),
    which the runtime calls once at load, so no inference pays for them.

    ``cuda_graph`` turns on ``relax.backend.use_cuda_graph`` (Relax's RewriteCUDAGraph captures
    the launch sequence of each static region in a CUDA graph on first run).

    Returns:
        ``(executable, transform)``: the ``tvm.relax.Executable`` and the name of the weight
        transform function (None when there is none).
    """
    tvm = import_tvm()
    from tvm import relax

    transform = None
    if target.kind.name == "llvm":
        if schedule:
            from passctl.targets.tvm.cpu_schedule import conv_layout_pass

            with target:
                mod = conv_layout_pass()(mod)
                mod = relax.transform.LiftTransformParams()(mod)
            names = {gv.name_hint for gv in mod.get_global_vars()}
            transform = TRANSFORM_PARAMS if TRANSFORM_PARAMS in names else None
        pipeline = cpu_pipeline(target, schedule=schedule)
    else:
        pipeline = gpu_pipeline(target, tensorize=tensorize)
    if cuda_graph:
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            return tvm.compile(mod, target=target, relax_pipeline=pipeline), transform
    return tvm.compile(mod, target=target, relax_pipeline=pipeline), transform


def pack_gpu_weights(mod, target):
    """Prepare ``mod``'s weights for a CUDA build with library GEMMs: matmuls sharing their left
    operand (an attention block's Q, K and V projections) become one matmul on the weights
    concatenated along N, with the concatenated bias and one ``split``
    (``relax.transform.CombineParallelMatmul``: one [M, K] x [K, 3N] GEMM fills the GPU better
    than three [M, K] x [K, N] ones), and every computation on weights alone (those concats) is
    lifted into :data:`TRANSFORM_PARAMS` (``relax.transform.LiftTransformParams``), which the
    runtime calls once at load.

    Returns:
        ``(mod, transform)``: the module and the transform function's name (None when none).
    """
    import_tvm()
    from tvm import relax

    def bias_last(_builder, call):
        # add(b, x) with a lower-rank b -> add(x, b): exporters write the bias first (torch's
        # legacy exporter: Add(bias, MatMul)); CombineParallelMatmul matches add(matmul, bias) only
        ranks = [_rank(x) for x in call.args]
        if (getattr(call.op, "name", None) == "relax.add" and len(ranks) == 2
                and None not in ranks and ranks[0] < ranks[1]):
            return relax.op.add(call.args[1], call.args[0])
        return None

    mod, _ = _rewrite_calls(mod, bias_last)
    with target:
        mod = relax.transform.CombineParallelMatmul()(mod)
        mod = relax.transform.LiftTransformParams()(mod)
    mod = split_as_slices(mod)
    names = {gv.name_hint for gv in mod.get_global_vars()}
    return mod, TRANSFORM_PARAMS if TRANSFORM_PARAMS in names else None


def split_as_slices(mod, func_name: str = "main"):
    """Every ``split(x)[i]`` of ``func_name`` becomes ``strided_slice(x)`` of the same range (the
    ``split`` then goes): TVM's FuseOps never fuses a ``split`` (a tuple-valued op) with what
    reads its parts, so each part was its own copy kernel; a slice fuses into its consumers (the
    packed Q/K/V projection's head reshape + transpose: BERT-base's 36 split kernels, 115 us of
    5.7 ms at batch 8 seq 128 fp32 on the H200, went away). Parts whose split has a static shape
    only; the rest stay.

    Returns:
        The rewritten module.
    """
    import_tvm()
    from tvm import relax

    func = mod[func_name]
    splits = {}
    for block in func.body.blocks:
        for bd in block.bindings:
            val = getattr(bd, "value", None)
            if not _is_call(val, "relax.split"):
                continue
            axis = int(val.attrs.axis)
            try:
                sizes = [int(f.shape[axis]) for f in bd.var.ty.fields]
            except (TypeError, AttributeError):
                continue
            bounds, start = [], 0
            for size in sizes:
                bounds.append((start, start + size))
                start += size
            splits[bd.var] = (val.args[0], axis, bounds)
    if not splits:
        return mod

    @relax.expr_functor.mutator
    class _Slices(relax.PyExprMutator):
        def visit_tuple_getitem_(self, item):
            src = splits.get(item.tuple_value) if isinstance(item.tuple_value, relax.Var) else None
            if src is None:
                return super().visit_tuple_getitem_(item)
            x, axis, bounds = src
            lo, hi = bounds[int(item.index)]
            return relax.op.strided_slice(self.visit_expr(x), [axis], [lo], [hi])

    rewriter = _Slices(mod)
    new_func = rewriter.visit_expr(func)
    out = rewriter.builder_.get()
    out[func_name] = new_func
    return relax.transform.DeadCodeElimination([func_name])(out)


def gelu_from_formula(mod, func_name: str = "main"):
    """Every GELU written as its formula in ``func_name`` becomes one ``nn.gelu`` /
    ``nn.gelu_tanh`` call, so the CUDA build's GEMM dispatch takes it into the epilogue
    (:func:`passctl.targets.tvm.triton_dispatch.dispatch_gemms`) instead of leaving a separate
    elementwise kernel (BERT-base batch 8 seq 128 fp32 on the H200: 141 us of 5.7 ms).

    The forms are those ``lower-standard`` writes below opset 20
    (:func:`passctl.passes.lowering.lower_standard.gelu`): ``(x * 0.5) * (erf(x / sqrt 2) + 1)`` and
    ``(x * 0.5) * (tanh((x + x^3 * 0.044715) * sqrt(2 / pi)) + 1)``, constants within 1e-6
    relative or their dtype's rounding (Hendrycks & Gimpel 2016; ONNX Gelu-20).

    Returns:
        ``(mod, count)``: the rewritten module and the number of GELUs rewritten.
    """
    import_tvm()
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, half, one, sqrt2, kappa, beta = (wildcard(), is_const(), is_const(), is_const(),
                                        is_const(), is_const())
    outer = is_op("relax.multiply")(is_op("relax.multiply")(x, half), is_op("relax.add")(
        is_op("relax.erf")(is_op("relax.divide")(x, sqrt2)), one))
    cube = is_op("relax.multiply")(is_op("relax.multiply")(x, x), x)
    inner = is_op("relax.multiply")(is_op("relax.add")(x, is_op("relax.multiply")(cube, kappa)), beta)
    outer_tanh = is_op("relax.multiply")(is_op("relax.multiply")(x, half), is_op("relax.add")(
        is_op("relax.tanh")(inner), one))
    count = [0]

    def near(expr, value: float) -> bool:  # a scalar, as the rewrite rules match constants
        from passctl.passes.rewrite.pattern import constant_close

        arr = np.asarray(expr.value.numpy() if hasattr(expr.value, "numpy") else expr.value)
        return arr.size == 1 and constant_close(arr, value, 1e-6)

    def rewrite(op, form):
        def _rewrite(expr, matches):
            if not (near(matches[half], 0.5) and near(matches[one], 1.0)):
                return expr
            if form == "erf" and near(matches[sqrt2], math.sqrt(2.0)):
                count[0] += 1
                return op(matches[x])
            if form == "tanh" and near(matches[kappa], 0.044715) and near(
                    matches[beta], math.sqrt(2.0 / math.pi)):
                count[0] += 1
                return op(matches[x])
            return expr
        return _rewrite

    func = rewrite_call(outer, rewrite(relax.op.nn.gelu, "erf"), mod[func_name])
    func = rewrite_call(outer_tanh, rewrite(relax.op.nn.gelu_tanh, "tanh"), func)
    if not count[0]:
        return mod, 0
    mod[func_name] = func
    return relax.transform.DeadCodeElimination([func_name])(mod), count[0]


def _is_call(expr, name: str) -> bool:
    from tvm import relax

    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == name


def _rank(expr):
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    try:
        return len(shape) if shape is not None else None
    except TypeError:
        return None


def accumulate_in_fp32(mod):
    """Every ``matmul`` of float16 / bfloat16 result becomes ``astype(matmul(a, b,
    out_dtype="float32"), dtype)``: TVM 0.27 legalizes a half-precision matmul with a
    half-precision accumulator (a [1024, 768] x [768, 3072] fp16 matmul came out 8.9e-3 off on the
    CPU, against 3.5e-4 for ONNX Runtime, which accumulates in float32 as cuBLAS and the Triton
    kernels do). The product is then summed in float32 and rounded once.

    Returns:
        ``(mod, count)``: the module and the number of matmuls changed.
    """
    import_tvm()
    from tvm import relax

    def widen(builder, call):
        dtype = str(getattr(call.ty, "dtype", ""))
        if (getattr(call.op, "name", None) != "relax.matmul" or len(call.args) != 2
                or dtype not in ("float16", "bfloat16")):
            return None
        wide = builder.normalize(relax.op.matmul(call.args[0], call.args[1], out_dtype="float32"))
        return relax.op.astype(wide, dtype)

    return _rewrite_calls(mod, widen)


def _rewrite_calls(mod, rewrite):
    """Apply ``rewrite(builder, call) -> new expr or None`` to every call (operands first) of
    every Relax function of ``mod``; returns ``(mod, number of calls rewritten)``."""
    from tvm import relax

    count = [0]

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            new = rewrite(self.builder_, call)
            if new is None:
                return call
            count[0] += 1
            return new

    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = _Rewriter(mod).visit_expr(func)
    return mod, count[0]


def cuda_source(executable) -> str:
    """The CUDA C source of a built executable's kernels ("" when it has no CUDA module).

    The codegen's source stays in the module even where this TVM was built without the CUDA
    runtime (then nothing compiled it): :func:`check_cuda_source` compiles it for the target.
    """
    todo, source = [executable.mod], []
    while todo:
        mod = todo.pop()
        todo.extend(mod.imports)
        if mod.kind == "cuda":
            source.append(mod.inspect_source(""))
    return "\n".join(source)


def check_cuda_source(source: str, arch: str) -> None:
    """Compile CUDA ``source`` for ``arch`` (``"sm_90"``) with ``nvcc`` when it is on PATH, else
    NVRTC (cuda-python), through TVM's own ``tvm.support.nvcc.compile_cuda``.

    Raises:
        RuntimeError: the compiler's message, with every error line, when the source is rejected.
    """
    import shutil

    from tvm.support.nvcc import compile_cuda

    tvm = import_tvm()
    compiler = "nvcc" if shutil.which("nvcc") else "nvrtc"
    with tvm.target.Target({"kind": "cuda", "arch": arch}):
        compile_cuda(source, target_format="cubin", arch=arch, compiler=compiler)


__all__ = ["accumulate_in_fp32", "check_cuda_source", "compile_module", "pack_gpu_weights", "cpu_pipeline", "cuda_source", "gpu_pipeline"]
