"""Field-by-field ONNX proto comparison for round-trip tests (names each difference by its path)."""

from __future__ import annotations

import struct
from typing import List

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

PROVENANCE_KEY = "passctl.provenance"
# Repeated fields whose order carries no meaning: compared as name -> entry maps.
_KEYED = {"value_info": "name", "metadata_props": "key", "opset_import": "domain"}


def proto_diff(a: Message, b: Message, path: str = "model", limit: int = 20) -> List[str]:
    """Differences between two protos of the same type, as ``path: a != b`` lines.

    ``value_info``, ``metadata_props`` and ``opset_import`` are compared as maps (their order has
    no meaning in ONNX); the ``passctl.provenance`` metadata key is ignored.
    """
    out: List[str] = []
    _diff(a, b, path, out, limit)
    return out


def _diff(a, b, path, out, limit):
    if len(out) >= limit:
        return
    for fd in a.DESCRIPTOR.fields:
        name = fd.name
        va, vb = getattr(a, name), getattr(b, name)
        p = f"{path}.{name}"
        if _repeated(fd):
            if name in _KEYED and fd.message_type is not None:
                key = _KEYED[name]
                ma = {getattr(x, key): x for x in va if getattr(x, key, None) != PROVENANCE_KEY}
                mb = {getattr(x, key): x for x in vb if getattr(x, key, None) != PROVENANCE_KEY}
                if set(ma) != set(mb):
                    out.append(f"{p}: keys differ: only in a {sorted(set(ma) - set(mb))[:5]}, "
                               f"only in b {sorted(set(mb) - set(ma))[:5]}")
                    continue
                for k in ma:
                    _diff(ma[k], mb[k], f"{p}[{k!r}]", out, limit)
                continue
            if len(va) != len(vb):
                out.append(f"{p}: {len(va)} entries != {len(vb)}")
                continue
            if fd.message_type is not None:
                for i, (x, y) in enumerate(zip(va, vb)):
                    _diff(x, y, f"{p}[{i}]", out, limit)
            elif _bits(fd, list(va)) != _bits(fd, list(vb)):
                out.append(f"{p}: {list(va)[:8]} != {list(vb)[:8]}")
        elif fd.message_type is not None:
            ha, hb = a.HasField(name), b.HasField(name)
            if ha != hb:
                out.append(f"{p}: set in one proto only ({ha} vs {hb})")
            elif ha:
                _diff(va, vb, p, out, limit)
        elif _bits(fd, [va]) != _bits(fd, [vb]):
            out.append(f"{p}: {va!r:.80} != {vb!r:.80}")
        if len(out) >= limit:
            return


def _repeated(fd: FieldDescriptor) -> bool:
    is_repeated = getattr(fd, "is_repeated", None)  # newer protobuf
    if is_repeated is not None:
        return is_repeated
    return fd.label == FieldDescriptor.LABEL_REPEATED


def _bits(fd: FieldDescriptor, values: list):
    """Floats as their bit patterns (NaN equals NaN, -0.0 differs from 0.0); others as they are."""
    if fd.type == FieldDescriptor.TYPE_FLOAT:
        return struct.pack(f"<{len(values)}f", *values)
    if fd.type == FieldDescriptor.TYPE_DOUBLE:
        return struct.pack(f"<{len(values)}d", *values)
    return values
