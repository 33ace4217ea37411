"""Lowering passes: canonical ``passctl::`` ops to a target's ops (``lower-onnxruntime``,
``lower-standard``) and the TVM frontend legalizations (``lower-tvm``); ``table`` holds the
per-target lowering table that fusion families extend with ``register_lowering``."""
