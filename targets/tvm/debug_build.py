"""Debug builds of a TVM artifact's IR (``ir.onnx``, :mod:`passctl.targets.tvm.ir_file`) with every
float tensor an output: what ``passctl compare`` pairs against the original's intermediates. Apart
from :mod:`passctl.targets.tvm.ir_file` because it translates with the emitter's route, and the
emitter writes ``ir.onnx`` through ``ir_file`` (imports go one way)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import numpy as np

from passctl.ir import Model
from passctl.ir.errors import UserError
from passctl.targets.tvm.ir_file import exposable_outputs


class DebugBuild:
    """The IR of a TVM artifact compiled again for the artifact's (CPU) target with every float
    tensor of :func:`exposable_outputs` a graph output, run on the Relax VM.

    The same route as the emitter (:func:`passctl.targets.tvm.frontend.to_relax`,
    ``accumulate_in_fp32``, :func:`passctl.targets.tvm.build.compile_module` with the manifest's
    ``cpu_schedules``); the kernels differ from the shipped ones since the exposed tensors cut
    the fusion groups (a tensor computed inside a shipped fused kernel is written out here).

    Args:
        model: the artifact's IR (``ir.onnx`` loaded; modified: outputs added).
        manifest: the artifact's ``manifest.json``.

    Raises:
        UserError: a CUDA artifact (debug builds are for ``cpu`` artifacts), or TVM cannot
            translate or build the IR with those outputs (one line).
    """

    def __init__(self, model: Model, manifest: Mapping[str, Any]):
        from passctl.targets.tvm.support import import_tvm

        tvm = import_tvm()
        if manifest.get("device") != "cpu":
            raise UserError("debug builds are made for cpu (llvm) artifacts only")
        names = exposable_outputs(model)
        values = {v.name: v for n in model.graph for v in n.outputs}
        base = [v.name for v in model.graph.outputs]
        for name in names:
            model.graph.outputs.append(values[name])
        self.output_names: List[str] = base + names
        from passctl.targets.tvm.build import accumulate_in_fp32, compile_module
        from passctl.targets.tvm.emit import _translate

        mod, params = _translate(model, model.graph.name or "model")
        mod, _ = accumulate_in_fp32(mod)
        try:
            target = tvm.target.Target(dict(manifest["target"]))
            executable, transform = compile_module(mod, target,
                                                   schedule=bool(manifest.get("cpu_schedules")))
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - TVM raises TVMError / ValueError / ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            raise UserError(f"TVM cannot build the IR with every tensor an output: {first}") from e
        from tvm.runtime.vm import VirtualMachine

        self.device = tvm.runtime.cpu(0)
        self.vm = VirtualMachine(executable, self.device)
        self.params = list(params)  # host tensors already (detach_params), no copy
        if transform:
            self.params = list(self.vm[transform](self.params))
        self.inputs = [(v.name, np.dtype(v.dtype.numpy())) for v in model.graph.inputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Run once; ``{name: array}`` for the graph outputs then the exposed tensors.

        Raises:
            KeyError: an input is missing.
        """
        import tvm.runtime as rt

        args = [rt.tensor(np.asarray(feeds[n], dtype=d, order="C"), self.device)
                for n, d in self.inputs]
        out = self.vm["main"](*args, *self.params)
        outs = [out] if hasattr(out, "numpy") else list(out)
        return {n: t.numpy() for n, t in zip(self.output_names, outs)}


__all__ = ["DebugBuild"]
