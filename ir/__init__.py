"""passctl's graph IR: typed SSA values, nodes, graphs, models; ONNX import/export; text form.

The names below are imported from their modules on first use (PEP 562), so importing a light
submodule such as ``passctl.ir.errors`` (the CLI's ``--help`` path) does not import onnx.
"""

import importlib

_EXPORTS = {
    "passctl.ir._builder": ("Builder",),
    "passctl.ir._core": ("Attr", "AttrType", "Function", "Graph", "Model", "Node", "Value",
                         "implicit_inputs", "union_provenance"),
    "passctl.ir._tensor": ("ExternalLocation", "Tensor"),
    "passctl.ir._spill": ("spill",),
    "passctl.ir.onnx_export": ("save", "to_onnx"),
    "passctl.ir.onnx_import": ("from_onnx", "load"),
    "passctl.ir.equality": ("assert_structurally_equal", "structural_diff"),
    "passctl.ir.parser": ("parse_file", "parse_graph", "parse_model"),
    "passctl.ir.printer": ("format_node", "print_graph", "print_model"),
    "passctl.ir._types": ("DataType", "MapType", "OptionalType", "SequenceType", "Shape",
                          "SparseTensorType", "TensorType", "Type", "UNNAMED_DIM_PARAMS",
                          "is_anonymous_dim"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'passctl.ir' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_WHERE))
