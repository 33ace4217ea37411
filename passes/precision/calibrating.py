"""The passes that calibrate under an accuracy budget (amp's ``mixed-precision``, ``quantize-int8``):
what they take from the compile context, and the budget the numeric check applies to them."""

from __future__ import annotations

from typing import ClassVar, List, Optional, Tuple

from passctl.passes.base import Pass
from passctl.support.context import CompileContext


class CalibratingPass(Pass):
    """A pass whose ``Options`` have ``target``, ``calib``, ``dims``, ``metric`` and ``budget``.

    From the compile context (:meth:`configure`), for the options the pipeline text does not give:
    ``target`` becomes the context's profile; ``calib`` its calibration folder; and without
    ``calib`` or ``dims``, ``dims`` the input sizes the emitter builds for (a TensorRT profile's OPT
    sizes), so the random calibration feeds and the measured error are at the sizes the artifact
    runs at (where the check runs too); and the emitter, whose artifact the numeric check runs at
    a known ONNX Runtime optimization level (:meth:`shipped_optimization`), the level the pass
    measures its budget at. Subclasses set ``budget_label``, how messages name them.
    """

    budget_label: ClassVar[str] = ""
    _emitter: Optional[str] = None
    _artifact_optimization: str = ""

    def configure(self, context: CompileContext) -> List[str]:
        """Take ``target``, ``calib`` and ``dims`` from ``context`` (see the class docstring).

        Returns:
            a note when ``dims`` was taken from the context's input sizes.
        """
        o, given = self.options, self.given_options
        self._emitter = context.emitter or None
        self._artifact_optimization = context.artifact_optimization
        if context.target is not None and "target" not in given:
            o.target = context.target.name
        if context.calibration and "calib" not in given and not o.calib:
            o.calib = context.calibration
        if not context.input_sizes or o.calib or o.dims:
            return []
        o.dims = ";".join(f"{k}={v}" for k, v in context.input_sizes.items())
        shown = ", ".join(f"{k}={v}" for k, v in context.input_sizes.items())
        return [f"{self.name} calibrates at the emitter's input sizes {shown} (give "
                f"{self.name}{{dims=...}} or calib= to choose)"]

    def shipped_optimization(self) -> str:
        """The ONNX Runtime graph optimization level the numeric check runs this pass's output at,
        as shipped (:func:`passctl.support.check.check_optimization`): for the compile context's
        emitter, else the ``target`` profile's default emitter (``onnxruntime``: its
        ``session.json`` level, ``ORT_ENABLE_ALL``, or the level the emitter was told,
        ``CompileContext.artifact_optimization``; ``tensorrt``: ``ORT_DISABLE_ALL``)."""
        from passctl.support.check import check_optimization

        if self._artifact_optimization:
            return self._artifact_optimization
        from passctl.support.profiles import get_target

        emitter = self._emitter or get_target(self.options.target).default_emitter
        return check_optimization(emitter)

    def reference_run(self, model, dims) -> Tuple[list, list, str]:
        """``(feeds, reference outputs, level)``: the calibration feeds of the options (``calib``,
        ``samples``, ``seed``; ``dims``: the parsed ``dims`` option), the float model's outputs on them (ONNX Runtime,
        optimizations off) and the level the trial graphs are measured at
        (:meth:`shipped_optimization`).

        Raises:
            UserError: the feeds cannot be made, or ONNX Runtime cannot run the float model on
                them (one line naming the pass and what to fix).
        """
        from passctl.ir.errors import UserError
        from passctl.passes.precision.sensitivity import calibration_inputs, run_model

        o = self.options
        feeds = calibration_inputs(model, o.calib, o.samples, o.seed, dims, owner=self.name)
        try:
            reference = run_model(model, feeds)
        except UserError:
            raise
        except Exception as e:  # the user's model or feeds
            first = str(e).splitlines()[0][:300] if str(e) else ""
            raise UserError(f"{self.name}: ONNX Runtime cannot run the float32 model on the "
                            f"calibration feeds ({type(e).__name__}: {first}); fix the feeds "
                            "(calib=, dims=)") from e
        return feeds, reference, self.shipped_optimization()

    def error_budget(self) -> Optional[Tuple[str, float, str]]:
        """``(metric, budget, budget_label)``: the output error this pass accepts."""
        return self.options.metric, float(self.options.budget), self.budget_label


__all__ = ["CalibratingPass"]
