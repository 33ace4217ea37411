"""Write a TVM artifact (model.so, model.params, manifest.json) from the IR and prove it runs."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import time
from typing import Any, Dict, Optional

import numpy as np

from passctl.ir import Model
from passctl.ir.errors import UserError
from passctl.support.profiles import TargetProfile
from passctl.targets.base import EmitError, Emitter, value_specs
from passctl.targets.registry import register_emitter
from passctl.targets.tvm.runtime import (LIBRARY_FILE, MANIFEST_FILE, MANIFEST_SCHEMA,
                                         PARAMS_FILE, load_artifact)
from passctl.targets.tvm.support import import_tvm, tvm_target

logger = logging.getLogger(__name__)

#: Largest relative error (max |a - b| / max |b|) of a float32 output against ONNX Runtime on the
#: same IR that the emitter's self-check accepts; above it the artifact is refused (EmitError).
SELF_CHECK_RTOL = 1e-3
#: The same for float16 / bfloat16 outputs (half precision rounds at 2^-11 relative: ONNX Runtime
#: and TVM round at different points).
SELF_CHECK_RTOL_HALF = 1e-2
#: For graphs with QuantizeLinear (int8 QDQ), a bound on the mean relative error (sum |a - b| /
#: sum |b|) instead: a float difference of one ulp before a QuantizeLinear can move a value to the
#: next int8 level, and the flips compound through the layers. Measured on PP-OCR cls after
#: ``quantize`` (5 random inputs): TVM equals ONNX Runtime (optimizations off) on 3, differs by
#: 0.6% and 5.5% on two; ONNX Runtime with optimizations on differs from itself off by up to 2.6%.
#: A translation bug (a wrong layout, axis or scale) gives errors of order 1.
SELF_CHECK_QDQ_MEAN_REL = 1e-1


class TvmTranslationError(UserError):
    """TVM's frontend failed on a node the pre-build check accepted (one line, names the node)."""


def _translate(model: Model, source: str, kernels=None):
    """:func:`passctl.targets.tvm.frontend.to_relax` with frontend failures as one-line errors."""
    from passctl.targets.tvm import frontend

    quiet = io.StringIO()  # the frontend prints "Error converting operator ..." itself
    try:
        with contextlib.redirect_stdout(quiet):
            return frontend.to_relax(model, source, kernels)
    except UserError:
        raise
    except frontend.NodeConversionError as e:
        node = next((n for n in model.graph.all_nodes() if n.name == e.node), None)
        origin = ", ".join(node.provenance) if node is not None and node.provenance else e.node
        raise TvmTranslationError(f"{source}: TVM's ONNX frontend failed on {e} (from {origin}); "
                                  "a legalization pass (lower-tvm) should rewrite this node") from e
    except Exception as e:  # TVM raises ValueError, TVMError, AssertionError...
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise TvmTranslationError(f"{source}: TVM's ONNX frontend failed: {first}") from e


def _plain(obj: Any) -> Any:
    """A TVM target export (Map / Array / String / IntImm) as plain JSON-ready Python values."""
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj
    if hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        return [_plain(v) for v in obj]
    if hasattr(obj, "value"):
        return obj.value
    return str(obj)


@register_emitter
class TvmEmitter(Emitter):
    """The ``tvm`` emitter: the IR through TVM's Relax to a compiled shared library.

    Writes ``model.so`` (``Executable.export_library``), ``model.params`` (the weights,
    ``tvm.runtime.save_param_dict_to_file``), ``ir.onnx`` (the IR it translated, its weights
    pointing into ``model.params``: :mod:`passctl.targets.tvm.ir_file`; ``passctl compare``
    builds its debug module from it) and ``manifest.json`` (see
    :class:`passctl.targets.tvm.runtime.TvmArtifact`). For ``cpu`` it then loads the artifact with
    ``tvm.runtime`` only, runs it on seeded inputs and compares with ONNX Runtime on the same IR;
    GPU artifacts are cross-compiled (``nvcc`` needed) and only written.

    Args:
        schedule: apply passctl's CPU schedules (llvm only; False gives TVM's unscheduled kernels).
        self_check: run the CPU artifact against ONNX Runtime after writing it.
        tensorize: CUDA only: DLight's tensor-core (WMMA) schedules for the fp16 / int8 matmuls
            left to DLight (see :func:`passctl.targets.tvm.build.gpu_pipeline`). Off by default:
            TVM 0.27 segfaults in Tensorize on fp16 matmuls (docs/tvm.md).
        kernels: CUDA only: ``"triton"`` runs GEMMs (with their bias / GELU / ReLU / residual
            epilogue) and ``passctl::Attention`` on Triton kernels embedded in the library
            (:mod:`passctl.targets.tvm.triton_dispatch`; TVM 0.27's wheel has no cuBLAS / cuDNN),
            ``"tvm"`` leaves every kernel to TVM's DLight schedules, ``"auto"`` is ``"triton"``
            where Triton and TVM's CUDA runtime are present (else ``"tvm"``, logged and written
            to the manifest).
        tune: time each Triton kernel's candidate tile configurations on this machine's GPU
            (needs torch with CUDA) and keep the fastest; ``None``: when the visible GPU has the
            target profile's compute capability.
        fp32_precision: float32 GEMMs / attention on Triton: ``"ieee"`` (float32 FMA),
            ``"tf32x3"`` (tensor cores, error-compensated: three TF32 products per input pair) or
            ``"tf32"`` (tensor cores, 10-bit mantissa: a precision change, off unless asked for).
        cuda_graph: CUDA only: capture the Relax VM's kernel launches in CUDA graphs
            (``relax.backend.use_cuda_graph``; TVM artifacts have static shapes), which removes
            per-launch CPU overhead (BERT-base b8 s128 fp32 on the H200: 6.25 -> 6.01 ms).
    """

    name = "tvm"

    def __init__(self, schedule: bool = True, self_check: bool = True, tensorize: bool = False,
                 kernels: str = "auto", tune: Optional[bool] = None, fp32_precision: str = "ieee",
                 cuda_graph: bool = True):
        if kernels not in ("auto", "triton", "tvm"):
            raise UserError(f"TVM emitter kernels='{kernels}': use 'auto', 'triton' or 'tvm'")
        if fp32_precision not in ("ieee", "tf32", "tf32x3"):
            raise UserError(f"TVM emitter fp32_precision='{fp32_precision}': use 'ieee', 'tf32' or "
                            "'tf32x3'")
        self.schedule = schedule
        self.self_check = self_check
        self.tensorize = tensorize
        self.kernels = kernels
        self.tune = tune
        self.fp32_precision = fp32_precision
        self.cuda_graph = cuda_graph

    def preflight(self, target: TargetProfile, check: bool = False) -> None:
        """Refuse early what cannot work here (see :meth:`Emitter.preflight`): Triton kernels
        asked for where they cannot be built, or for the CPU; ``--check`` of a CUDA artifact on a
        machine without a CUDA device. A GPU-only option given for the CPU is a warning.

        Raises:
            UserError: one line with what to do instead.
        """
        if not target.is_gpu:
            if self.kernels == "triton":
                raise UserError(f"target '{target.name}': kernels=triton is for GPU targets (the CPU "
                                "build uses passctl's llvm schedules); drop the option")
            if self.fp32_precision != "ieee":
                logger.warning("target %s: fp32_precision=%s applies to Triton kernels on GPU "
                               "targets; ignored", target.name, self.fp32_precision)
            gpu_only = [f"{k}={v}" for k, v, default in (
                ("kernels", self.kernels, "auto"), ("tensorize", self.tensorize, False),
                ("cuda_graph", self.cuda_graph, True), ("tune", self.tune, None)) if v != default]
            if gpu_only:
                logger.warning("target %s: %s only apply to GPU targets; ignored", target.name,
                               ", ".join(gpu_only).replace("True", "true").replace("False", "false"))
            return
        if self.kernels == "triton":
            self._triton_usable(target)  # raises when Triton or the CUDA runtime is missing
        if check:
            from passctl.targets.tvm.runtime import device_available

            if not device_available("cuda"):
                raise UserError(f"--check runs the artifact, and this machine has no CUDA device to "
                                f"run a '{target.name}' TVM artifact on; drop --check here and use "
                                "`passctl run OUT` on the GPU machine")

    def _triton_usable(self, target: TargetProfile) -> str:
        """Why Triton kernels cannot be built here for GPU ``target`` (logged as a warning for
        ``kernels="auto"``), or the empty string when they can.

        Raises:
            UserError: ``kernels="triton"`` and they cannot.
        """
        from passctl.targets.tvm import triton_dispatch

        ok, why = triton_dispatch.available()
        if ok:
            return ""
        if self.kernels == "triton":
            raise UserError(f"target '{target.name}': Triton kernels were asked for, but {why}; "
                            "build on a machine with a CUDA driver, or use kernels=auto "
                            "(DLight kernels here)")
        logger.warning("target %s: GEMMs and attention on TVM's DLight kernels: %s%s",
                       target.name, why, f"; fp32_precision={self.fp32_precision} (a Triton "
                       "option) is ignored" if self.fp32_precision != "ieee" else "")
        return why

    def _kernel_library(self, target: TargetProfile):
        """``(TritonLibrary, "")`` for a CUDA build with Triton kernels, else ``(None, why not)``."""
        if not target.is_gpu or self.kernels == "tvm":
            return None, "DLight schedules only (kernels='tvm')" if target.is_gpu else ""
        why = self._triton_usable(target)
        if why:
            return None, why
        from passctl.targets.tvm import triton_dispatch

        tune = self.tune
        if tune is None:  # timing on another GPU than the target's would pick its tiles
            try:
                import torch

                tune = bool(torch.cuda.is_available()) and \
                    tuple(torch.cuda.get_device_capability(0)) == tuple(target.compute_capability)
            except ImportError:
                tune = False
        return triton_dispatch.TritonLibrary(target.compute_capability, target.sm_count or 0,
                                             tune=tune, fp32_precision=self.fp32_precision), ""

    def write(self, model: Model, target: TargetProfile, folder: str) -> Dict[str, Any]:
        """Write the artifact into ``folder`` (see :meth:`Emitter.write`).

        Returns:
            ``{"emitter", "files", "target", "seconds": {"translate", "compile", "export"},
            "weight_bytes", "self_check"}``.

        Raises:
            UserError: unsupported nodes, symbolic input shapes, apache-tvm or nvcc missing (all
                before TVM builds anything), or a frontend failure (:class:`TvmTranslationError`).
            EmitError: the CPU artifact does not load, or its outputs differ from ONNX Runtime's.
        """
        source = model.graph.name or "model"
        tgt = tvm_target(target)  # before the translation: a missing nvcc is reported first
        tvm = import_tvm()
        t0 = time.perf_counter()
        library, no_library = self._kernel_library(target)
        mod, params = _translate(model, source, library)
        gemms, gpu_transform = 0, None
        if library is not None:
            from passctl.targets.tvm.build import gelu_from_formula, pack_gpu_weights
            from passctl.targets.tvm.triton_dispatch import dispatch_gemms

            mod, _ = gelu_from_formula(mod)  # lower-standard's GELU formula: one epilogue op
            mod, gpu_transform = pack_gpu_weights(mod, tgt)
            mod, gemms = dispatch_gemms(mod, library)
            if library.kernels:
                mod = mod.with_attr("external_mods", library.modules())
        if target.is_gpu and self.tensorize:
            _refuse_fp16_tensorize(mod, source)
        from passctl.targets.tvm.build import accumulate_in_fp32

        mod, _ = accumulate_in_fp32(mod)  # the matmuls left to TVM: float32 sums, as ONNX Runtime
        t1 = time.perf_counter()
        from passctl.targets.tvm.build import compile_module

        executable, transform = compile_module(mod, tgt, schedule=self.schedule,
                                               tensorize=self.tensorize,
                                               cuda_graph=self.cuda_graph and target.is_gpu)
        transform = transform or gpu_transform
        t2 = time.perf_counter()
        executable.export_library(os.path.join(folder, LIBRARY_FILE))
        names = [f"p{i}" for i in range(len(params))]  # the weights as translated (pre-transform)
        tvm.runtime.save_param_dict_to_file(dict(zip(names, params)),
                                            os.path.join(folder, PARAMS_FILE))
        from passctl.targets.tvm.ir_file import write_ir

        ir = write_ir(model, folder)  # what passctl compare builds its debug module from
        t3 = time.perf_counter()
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "library": LIBRARY_FILE,
            "params": PARAMS_FILE,
            "param_names": names,
            "inputs": value_specs(model.graph.inputs),
            "outputs": value_specs(model.graph.outputs),
            "device": "cuda" if target.is_gpu else "cpu",
            "target": _plain(tgt.export()),
            "profile": target.to_dict(),
            "tvm_version": tvm.__version__,
            "cpu_schedules": bool(self.schedule and not target.is_gpu),
            "transform_params": transform,
            "tensor_cores": bool(target.is_gpu and (self.tensorize or library is not None)),
            "kernels": ("triton" if library is not None else "tvm") if target.is_gpu else "tvm",
            "ir": ir,
        }
        if target.is_gpu:
            manifest["cuda_graph"] = bool(self.cuda_graph)
            manifest["fp32_precision"] = self.fp32_precision if library is not None else "ieee"
            if library is not None:
                manifest["triton"] = {"gemms": gemms, "tuned": library.tune,
                                      "fp32_precision": library.fp32_precision,
                                      "specializations": library.log}
            else:
                manifest["kernels_note"] = no_library
        with open(os.path.join(folder, MANIFEST_FILE), "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
        check = None
        if self.self_check and not target.is_gpu:
            check = _self_check(model, folder)
        # from shape and dtype: p.numpy() would copy every weight (off the GPU, for cuda) to count
        weight_bytes = int(sum(np.dtype(str(p.dtype)).itemsize * int(np.prod(p.shape))
                               for p in params))
        seconds = {"translate": round(t1 - t0, 3), "compile": round(t2 - t1, 3),
                   "export": round(t3 - t2, 3)}
        logger.info("tvm artifact for %s: %s", target.name, seconds)
        return {"emitter": self.name, "files": sorted(os.listdir(folder)), "target": manifest["target"],
                "seconds": seconds, "weight_bytes": weight_bytes, "self_check": check}


def _refuse_fp16_tensorize(mod, source: str) -> None:
    """Raise before TVM builds when DLight's tensor-core schedule (``tensorize``) would get an
    fp16 / bf16 matmul: TVM 0.27 segfaults in ``s_tir::Tensorize`` on those (docs/tvm.md), which
    would kill the process without a message.

    Raises:
        UserError: one line naming the first such matmul's shapes and the option to change.
    """
    from tvm import relax

    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        found = []

        def visit(expr, found=found):
            if (isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.matmul"
                    and str(getattr(expr.ty, "dtype", "")) in ("float16", "bfloat16")):
                found.append(expr)

        relax.analysis.post_order_visit(func, visit)
        if found:
            shapes = " x ".join(str([int(d) for d in a.ty.shape]) for a in found[0].args)
            raise UserError(f"{source}: tensorize=true would hand TVM 0.27 a {found[0].ty.dtype} "
                            f"matmul ({shapes}), on which its Tensorize crashes; use "
                            "--emit 'tvm{tensorize=false}' (the default)")


def _self_check(model: Model, folder: str, seed: int = 0) -> Dict[str, Any]:
    """Run the artifact and ONNX Runtime (on the same IR, graph optimizations off) on seeded
    inputs; compare outputs with :func:`passctl.support.check.compare` (``max_rel``, or ``mean_rel``
    when the IR has QuantizeLinear)."""
    from passctl.ir import to_onnx
    from passctl.support.check import compare, run_onnxruntime
    from passctl.support.inputs import make_inputs

    proto = to_onnx(model)
    feeds = make_inputs(proto, seed=seed)
    try:
        artifact = load_artifact(folder)
        got = artifact.run(feeds)
    except Exception as e:
        raise EmitError(f"the TVM artifact does not run: {type(e).__name__}: "
                        f"{(str(e).strip().splitlines() or [''])[-1]}") from e
    try:
        # graph optimizations off: ONNX Runtime runs the IR as written, as TVM does. With them on it
        # fuses DequantizeLinear -> Conv -> QuantizeLinear into QLinearConv, whose fixed-point
        # requantization moves int8 levels against TVM's float Q/DQ (PP-OCR cls int8: 1.6e-2).
        want = run_onnxruntime(proto, feeds)
    except Exception as e:  # ONNX Runtime cannot run passctl:: ops: nothing to compare with
        logger.info("self-check skipped: ONNX Runtime cannot run the IR (%s)", e)
        return {"ok": None, "reason": "ONNX Runtime cannot run this IR", "outputs": {}}
    outputs = {}
    ok = True
    qdq = any(n.op_type == "QuantizeLinear" for n in model.graph.all_nodes())
    for name, diff in compare(want, {name: got[name] for name in want}).outputs.items():
        outputs[name] = {"max_rel": diff.max_rel}
        limit = {np.dtype(np.float32): SELF_CHECK_RTOL,
                 np.dtype(np.float16): SELF_CHECK_RTOL_HALF}.get(np.dtype(want[name].dtype))
        if limit is None:  # integer / bool outputs: reported, not bounded
            continue
        if qdq:  # int8 levels that round the other way: judge the total error, not the worst element
            outputs[name]["mean_rel"] = diff.mean_rel
        if not diff.ok(*((SELF_CHECK_QDQ_MEAN_REL, 0.0, "mean-rel") if qdq else (limit,))):
            ok = False
    if not ok:
        raise EmitError(f"the TVM artifact's outputs differ from ONNX Runtime's on the same IR: {outputs}")
    return {"ok": True, "seed": seed, "outputs": outputs}


__all__ = ["SELF_CHECK_QDQ_MEAN_REL", "SELF_CHECK_RTOL", "SELF_CHECK_RTOL_HALF", "TvmEmitter",
           "TvmTranslationError"]
