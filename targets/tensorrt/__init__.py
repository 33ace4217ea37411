"""The TensorRT emitter: strongly typed ONNX, per-layer precision, a trtexec script, and the engine."""

from passctl.targets.tensorrt.emit import (MANIFEST_SCHEMA, TensorRTEmitter, is_tensorrt_artifact,
                                           precision_table)

__all__ = ["MANIFEST_SCHEMA", "TensorRTEmitter", "is_tensorrt_artifact", "precision_table"]
