"""Load and run a passctl TVM artifact (model.so + weights + manifest.json) with tvm.runtime only."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Callable, Dict, List, Mapping

import numpy as np

from passctl.ir.errors import UserError

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
LIBRARY_FILE = "model.so"
PARAMS_FILE = "model.params"
MANIFEST_SCHEMA = "passctl.tvm.artifact/1"


def device_available(kind: str, device_id: int = 0) -> bool:
    """Whether ``tvm.runtime`` can run on ``kind`` (``"cpu"`` / ``"cuda"``) device ``device_id``
    here: the runtime has the backend and the device exists (a CUDA driver and GPU for cuda)."""
    import tvm.runtime as rt

    if kind == "cpu":
        return True
    try:
        return bool(rt.enabled(kind)) and bool(rt.device(kind, device_id).exist)
    except Exception:  # noqa: BLE001  (no driver: some TVM builds raise instead of returning False)
        return False


def read_manifest(folder: str) -> Dict:
    """The artifact's ``manifest.json`` as a dict (see :class:`TvmArtifact` for the keys).

    Raises:
        FileNotFoundError: ``folder`` has no manifest.
    """
    with open(os.path.join(folder, MANIFEST_FILE)) as f:
        return json.load(f)


class TvmArtifact:
    """A loaded TVM artifact: the Relax VM of ``model.so`` with its weights on the device.

    Needs only ``tvm.runtime`` (no passctl compiler code, no Relax compiler). The manifest holds
    ``schema``, ``library``, ``params`` (file), ``param_names`` (VM argument order after the inputs),
    ``inputs`` / ``outputs`` (``[{"name", "shape", "dtype"}]``), ``device`` (``"cpu"`` or ``"cuda"``),
    ``target`` (the TVM target as a dict) and ``transform_params`` (the VM function that puts the
    weights into the kernels' layout, called once here, or null).

    Args:
        folder: the artifact folder.
        device_id: the device ordinal for CUDA artifacts.
    """

    def __init__(self, folder: str, device_id: int = 0):
        import tvm.runtime as rt
        from tvm.runtime.vm import VirtualMachine

        self.folder = folder
        self.manifest = read_manifest(folder)
        kind = self.manifest["device"]
        if not device_available(kind, device_id):
            profile = self.manifest.get("profile", {})
            raise UserError(f"{folder}: a {kind} artifact (target {profile.get('name', kind)}, "
                            f"{profile.get('compute_capability', '')}) "
                            f"needs {kind} device {device_id}, which this machine does not have "
                            "(no CUDA driver or GPU); run it on the machine it was built for")
        self.device = rt.device(kind, device_id)
        lib = _load_file(folder, self.manifest["library"], rt.load_module)
        self.vm = VirtualMachine(lib, self.device)
        params = _load_file(folder, self.manifest["params"], rt.load_param_dict_from_file)
        self.params = [rt.tensor(params[n].numpy(), self.device) for n in self.manifest["param_names"]]
        transform = self.manifest.get("transform_params")
        if transform:  # weights into the kernels' layout, once (LiftTransformParams)
            self.params = list(self.vm[transform](self.params))
        self.input_names: List[str] = [i["name"] for i in self.manifest["inputs"]]
        self.output_names: List[str] = [o["name"] for o in self.manifest["outputs"]]

    def _args(self, feeds: Mapping[str, np.ndarray]) -> list:
        import tvm.runtime as rt

        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise KeyError(f"missing inputs {missing}; the artifact takes {self.input_names}")
        args = []
        for spec in self.manifest["inputs"]:
            # np.asarray keeps a rank-0 (scalar) input rank 0; np.ascontiguousarray makes it [1]
            array = np.asarray(feeds[spec["name"]], dtype=spec["dtype"], order="C")
            if list(array.shape) != list(spec["shape"]):
                raise ValueError(f"input '{spec['name']}' has shape {list(array.shape)}; the artifact "
                                 f"was built for {spec['shape']}")
            args.append(rt.tensor(array, self.device))
        return args + self.params

    def _call(self, args):
        out = self.vm["main"](*args)
        return list(out) if not hasattr(out, "numpy") else [out]

    def bind(self, feeds: Mapping[str, np.ndarray]) -> Callable[[], object]:
        """A no-argument call of the VM's ``main`` on ``feeds``, copied to the device once (for
        benchmark loops: no host-to-device copy, no output conversion, no device sync per call).

        Raises:
            KeyError, ValueError: as :meth:`run`.
        """
        args = self._args(feeds)
        return lambda: self.vm["main"](*args)

    def run(self, feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Run once; returns ``{output name: numpy array}`` in manifest order.

        Raises:
            KeyError: an input is missing. ValueError: an input has another shape than the
                artifact was built for (dtypes are converted).
        """
        outs = self._call(self._args(feeds))
        return {name: t.numpy() for name, t in zip(self.output_names, outs)}

    def latency_ms(self, feeds: Mapping[str, np.ndarray], runs: int = 10,
                   warmup: int = 2) -> List[float]:
        """Wall-clock milliseconds of ``runs`` calls after ``warmup`` calls (inputs already on the
        device; each call ends with a device synchronization)."""
        args = self._args(feeds)
        for _ in range(warmup):
            self._call(args)
        self.device.sync()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            self._call(args)
            self.device.sync()
            times.append((time.perf_counter() - start) * 1e3)
        return times


def _load_file(folder: str, name: str, load: Callable):
    """``load(folder/name)``, a damaged or missing file reported as a one-line UserError.

    Raises:
        UserError: ``tvm.runtime`` cannot load the file (TVM raises ``tvm.error.InternalError``, a
            RuntimeError, for a truncated library or a params file of another format).
    """
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise UserError(f"artifact '{folder}': {name} is missing; re-run passctl compile to write "
                        "the artifact again")
    try:
        return load(path)
    except (RuntimeError, OSError, ValueError) as e:
        text = str(e).strip()
        first = text.splitlines()[-1][:200] if text else type(e).__name__
        raise UserError(f"artifact '{folder}': {name} cannot be loaded by tvm.runtime ({first}); "
                        "re-run passctl compile to write the artifact again") from None


def load_artifact(folder: str, device_id: int = 0) -> TvmArtifact:
    """Load the TVM artifact in ``folder`` (see :class:`TvmArtifact`)."""
    return TvmArtifact(folder, device_id)


def is_tvm_artifact(folder: str) -> bool:
    """Whether ``folder`` holds a passctl TVM artifact (a manifest with the TVM schema)."""
    try:
        return read_manifest(folder).get("schema") == MANIFEST_SCHEMA
    except (OSError, ValueError):
        return False


__all__ = ["LIBRARY_FILE", "MANIFEST_FILE", "MANIFEST_SCHEMA", "PARAMS_FILE", "TvmArtifact", "device_available",
           "is_tvm_artifact", "load_artifact", "read_manifest"]
