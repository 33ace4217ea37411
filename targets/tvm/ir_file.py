"""The IR a TVM artifact was built from (``ir.onnx``), which ``passctl compare`` rebuilds with every
float tensor an output (:mod:`passctl.targets.tvm.debug_build`; docs/debugging.md).

``ir.onnx`` is the IR the emitter translated (``passctl.ir.to_onnx``: node names, and provenance in
each node's ``metadata_props["passctl.provenance"]``). Its weights are not a second copy: each
initializer whose raw bytes equal a tensor of ``model.params`` is stored as ONNX external data
pointing into ``model.params`` (``location``, ``offset``, ``length``: TVM's param file stores each
tensor's bytes contiguously, little endian, after a header, see :func:`params_layout`), the rest
(small constants, integers) inline.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from passctl.ir import DataType, Model
from passctl.ir.errors import UserError
from passctl.targets.tvm.runtime import PARAMS_FILE

logger = logging.getLogger(__name__)

IR_FILE = "ir.onnx"

#: ``kTVMNDArrayListMagic`` and ``kTVMNDArrayMagic`` of TVM's ``SaveParams`` / ``NDArray::Save``.
_LIST_MAGIC = 0xF7E58D4F05049CB7
_ARRAY_MAGIC = 0xDD5E40F096B4A13F


def params_layout(path: str) -> Dict[str, Tuple[int, int]]:
    """``{name: (offset, nbytes)}`` of each tensor's data in a TVM param file
    (``tvm.runtime.save_param_dict_to_file``).

    Layout (TVM ``src/runtime/file_utils.cc`` ``SaveParams`` and ``NDArray::Save``, all little
    endian): u64 list magic, u64 reserved, u64 name count then per name u64 length + bytes, u64
    tensor count, then per tensor u64 array magic, u64 reserved, i32 device type, i32 device id,
    i32 ndim, u8 code / u8 bits / u16 lanes, i64 shape[ndim], i64 data bytes, the data.

    Raises:
        ValueError: the file does not have that layout (a magic number or a length is wrong).
    """
    with open(path, "rb") as f:
        data = f.read(16)
        if len(data) < 16 or struct.unpack("<Q", data[:8])[0] != _LIST_MAGIC:
            raise ValueError(f"{path}: not a TVM param file")
        (count,) = struct.unpack("<Q", f.read(8))
        names = []
        for _ in range(count):
            (n,) = struct.unpack("<Q", f.read(8))
            names.append(f.read(n).decode("utf-8"))
        (tensors,) = struct.unpack("<Q", f.read(8))
        if tensors != count:
            raise ValueError(f"{path}: {count} names but {tensors} tensors")
        size = os.fstat(f.fileno()).st_size
        out = {}
        for name in names:
            magic, _, _, ndim = struct.unpack("<QQqi", f.read(28))
            if magic != _ARRAY_MAGIC:
                raise ValueError(f"{path}: tensor '{name}' has no array magic")
            f.read(4 + 8 * ndim)  # dtype, shape
            (nbytes,) = struct.unpack("<q", f.read(8))
            offset = f.tell()
            if nbytes < 0 or offset + nbytes > size:
                raise ValueError(f"{path}: tensor '{name}' runs past the end of the file")
            out[name] = (offset, nbytes)
            f.seek(nbytes, os.SEEK_CUR)
    return out


def _digest(buf) -> str:
    return hashlib.sha256(buf).hexdigest()


def write_ir(model: Model, folder: str) -> Dict[str, Any]:
    """Write ``folder/ir.onnx``: ``model`` as ONNX (provenance kept), initializers whose bytes are a
    tensor of ``folder/model.params`` (written before) stored as external data into that file.

    Returns:
        ``{"file", "weights_in_params", "weights_inline"}`` (counts of initializers).

    Raises:
        OSError: the folder is not writable.
    """
    from passctl.ir.onnx_export import _initializers, _write_atomic
    from passctl.ir.onnx_protos import ProtoBuilder
    from passctl.ir.onnx_stream import raw_nbytes

    params_path = os.path.join(folder, PARAMS_FILE)
    try:
        layout = params_layout(params_path)
    except (OSError, ValueError) as e:  # keep the artifact; the IR then carries its own weights
        logger.warning("ir.onnx embeds its weights: %s", e)
        layout = {}
    by_digest: Dict[Tuple[int, str], Tuple[int, int]] = {}
    if layout:
        with open(params_path, "rb") as f:
            for offset, nbytes in layout.values():
                f.seek(offset)
                by_digest.setdefault((nbytes, _digest(f.read(nbytes))), (offset, nbytes))
    plan: Dict[int, Tuple[int, int]] = {}
    inline = 0
    for v in _initializers(model.graph):
        t = v.const
        if id(t) in plan or t.source_proto is not None or t.dtype == DataType.STRING:
            inline += id(t) not in plan
            continue
        n = raw_nbytes(t)
        hit = by_digest.get((n, _digest(t.raw_view()))) if n >= 64 else None
        if hit is None:
            inline += 1
        else:
            plan[id(t)] = hit
    proto = ProtoBuilder(external=plan, location=PARAMS_FILE).model(model)
    path = os.path.join(folder, IR_FILE)
    _write_atomic(path, lambda f: f.write(proto.SerializeToString()))
    return {"file": IR_FILE, "weights_in_params": len(plan), "weights_inline": inline}


# -- debug builds -----------------------------------------------------------------------------------

def exposable_outputs(model: Model) -> List[str]:
    """Names of the main-graph node outputs a debug build can return: float tensors of known
    dtype, not graph outputs already, not Constant nodes' (weights), and only the outputs the TVM
    translation maps for passctl-domain ops (the first, SkipRMSNorm's two)."""
    from passctl.targets.tvm.frontend import mapped_outputs

    have = {v.name for v in model.graph.outputs}
    names = []
    for node in model.graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        for v in node.outputs[:mapped_outputs(node)]:
            dtype = v.dtype
            if not v.name or v.name in have or dtype is None:
                continue
            try:
                floating = np.issubdtype(np.dtype(dtype.numpy()), np.floating) or \
                    "bfloat16" in str(dtype).lower()
            except TypeError:
                floating = False
            if floating:
                names.append(v.name)
                have.add(v.name)
    return names


def load_ir(folder: str) -> Optional[Model]:
    """The artifact's ``ir.onnx`` as a :class:`Model` (weights memory-mapped from ``model.params``),
    or None when the artifact has none (built before passctl wrote it).

    Raises:
        UserError: ``ir.onnx`` exists but does not load (one line: re-run passctl compile).
    """
    path = os.path.join(folder, IR_FILE)
    if not os.path.isfile(path):
        return None
    from passctl.ir.errors import ModelLoadError
    from passctl.ir.onnx_import import load

    try:
        return load(path)
    except ModelLoadError as e:
        raise UserError(f"artifact '{folder}': {IR_FILE} does not load ({str(e)[:200]}); re-run "
                        "passctl compile to write the artifact again") from None


__all__ = ["IR_FILE", "exposable_outputs", "load_ir", "params_layout", "write_ir"]
