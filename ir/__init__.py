"""passctl's graph IR: typed SSA values, nodes, graphs, models; ONNX import/export; text form."""

from passctl.ir._builder import Builder
from passctl.ir._core import (Attr, AttrType, Function, Graph, Model, Node, Value, implicit_inputs,
                              union_provenance)
from passctl.ir._tensor import ExternalLocation, Tensor
from passctl.ir.onnx_export import save, to_onnx
from passctl.ir.onnx_import import from_onnx, load
from passctl.ir.equality import assert_structurally_equal, structural_diff
from passctl.ir.parser import parse_file, parse_graph, parse_model
from passctl.ir.printer import format_node, print_graph, print_model
from passctl.ir._types import (DataType, MapType, OptionalType, SequenceType, Shape,
                               SparseTensorType, TensorType, Type, UNNAMED_DIM_PARAMS,
                               is_anonymous_dim)

__all__ = [
    "Attr", "AttrType", "Builder", "DataType", "ExternalLocation", "Function", "Graph", "MapType",
    "Model", "Node", "OptionalType", "SequenceType", "Shape", "SparseTensorType", "Tensor",
    "TensorType", "Type", "Value", "assert_structurally_equal", "format_node", "from_onnx",
    "UNNAMED_DIM_PARAMS", "implicit_inputs", "is_anonymous_dim", "load", "parse_file",
    "parse_graph", "parse_model", "print_graph", "print_model", "save", "structural_diff", "to_onnx",
    "union_provenance",
]
