"""The neutral layer below passes, emitters and the CLI: running ONNX Runtime (``check``), drawing
inputs (``inputs``, ``input_files``), comparing outputs (``check``), input sizes (``dims``), target
profiles (``profiles``), the compile context (``context``) and the CLI's error classes (``errors``).

It imports only :mod:`passctl.ir` (and third-party packages), never passes, targets or tools.
"""
