"""Reading an ONNX file safely: one-line errors for bad input, weights kept out of the parsed proto."""

from __future__ import annotations

import codecs
import logging
import os
from typing import Optional, Tuple

import onnx
from google.protobuf.message import DecodeError

from passctl.ir.errors import ModelLoadError
from passctl.ir.onnx_split import Malformed, Split, Truncated, split_model

logger = logging.getLogger(__name__)

_SIGNATURES = {
    b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"GIF8": "a GIF image",
    b"PK\x03\x04": "a zip archive (a PyTorch .pt/.pth checkpoint?)", b"\x1f\x8b": "a gzip archive",
    b"GGUF": "a GGUF file (for generation, `passctl export-decoder` takes it)",
    b"\x80\x02": "a Python pickle", b"%PDF": "a PDF document",
    b"\x7fELF": "an executable",
}


def read_model_file(path: str) -> Tuple[onnx.ModelProto, Optional[Split]]:
    """Parse ``path`` as an ONNX model without loading external data.

    Large ``raw_data`` of the main graph's initializers and tensor attributes is read apart from
    the proto (see :mod:`passctl.ir.onnx_split`), so the weights are in memory once, not twice.

    Returns:
        The ModelProto and the raw bytes taken out of it (None when the file was parsed whole).

    Raises:
        ModelLoadError: one line naming ``path``, the problem and what to do.
    """
    _check_path(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    _check_head(path, head)
    try:
        proto, raws = split_model(path)
    except Truncated as e:
        if head[:1] == b"\x08":  # starts like a ModelProto (ir_version field)
            raise ModelLoadError(f"{path}: the ONNX file is truncated ({e}); export or download "
                                 "the model again") from None
        raise ModelLoadError(f"{path}: not an ONNX model (not a protobuf message: {e}); give a "
                             ".onnx file") from None
    except (Malformed, DecodeError, RuntimeError, ValueError, OSError) as e:
        logger.debug("%s: wire-format split failed (%s); parsing with onnx.load", path, e)
        proto, raws = _onnx_load(path, head), None
    if not proto.HasField("graph") or (proto.ir_version == 0 and not len(proto.opset_import)):
        raise ModelLoadError(f"{path}: not an ONNX model or truncated (no graph, ir_version or "
                             "opset_import found); give a complete .onnx file")
    if proto.ir_version >= 3 and not len(proto.opset_import):  # required since IR version 3
        raise ModelLoadError(f"{path}: the model has no opset_import (truncated file?); export or "
                             "download the model again")
    return proto, raws


def _onnx_load(path: str, head: bytes) -> onnx.ModelProto:
    try:
        return onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if head[:1] == b"\x08":  # starts like a ModelProto (ir_version field)
            raise ModelLoadError(f"{path}: corrupted, truncated or not an ONNX model (protobuf "
                                 f"parse failed: {reason}); export or download the model again"
                                 ) from None
        raise ModelLoadError(f"{path}: not an ONNX model (protobuf parse failed: {reason}); give "
                             "a .onnx file") from None


def _check_path(path: str) -> None:
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file; check the model path")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a folder, not an ONNX file; give the .onnx file inside it")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: not a regular file; give a .onnx file")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"{path}: cannot be read (permission denied); check its permissions")


def _check_head(path: str, head: bytes) -> None:
    if not head:
        raise ModelLoadError(f"{path}: the file is empty; export or download the model again")
    for sig, what in _SIGNATURES.items():
        if head.startswith(sig):
            raise ModelLoadError(f"{path}: is {what}, not an ONNX model; give a .onnx file")
    try:  # incremental: a multi-byte character cut at the 4096-byte boundary is not an error
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return
    if all(c.isprintable() or c in "\r\n\t" for c in text):
        raise ModelLoadError(f"{path}: is a text file, not an ONNX model (a binary protobuf); give "
                             "a .onnx file")
