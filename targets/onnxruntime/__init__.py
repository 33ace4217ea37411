"""The ONNX Runtime emitter: ``model.onnx`` plus a ``session.json`` of session options and providers."""

from passctl.targets.onnxruntime.emit import (OnnxRuntimeEmitter, create_session,
                                              session_config)

__all__ = ["OnnxRuntimeEmitter", "create_session", "session_config"]
