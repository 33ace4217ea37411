"""passctl IR -> Relax IRModule: TVM's ONNX frontend plus explicit converters for passctl:: ops."""

from __future__ import annotations

import logging
import re
import warnings
from typing import Callable, Dict, List, Tuple

import numpy as np

from passctl.ir import Model, Node, is_anonymous_dim
from passctl.ir.errors import UserError
from passctl.targets.tvm.names import safe_value_names
from passctl.targets.tvm.support import import_tvm

logger = logging.getLogger(__name__)

PASSCTL_DOMAIN = "passctl"
#: Prefix given to passctl-domain op types in the ONNX handed to TVM's frontend (which ignores
#: domains), so ``passctl::Gelu`` (with a Bias input) never reaches the frontend's ONNX Gelu.
_PREFIX = "passctl::"

#: How many leading outputs a passctl op's converter maps (1 when not listed): SkipRMSNorm's
#: converter returns (Y, S) when its sum output is used.
_MAPPED_OUTPUTS = {"SkipRMSNorm": 2}

# The ONNX ops TVM 0.27's Relax frontend handles outside its converter table.
_DIRECT = {"If", "Constant"}


def _converter_table(kernels=None) -> Dict[str, Callable]:
    """passctl op type -> ``fn(bb, inputs, attrs) -> relax.Expr`` (math: dialect/canonical.py;
    ``Attention``: targets/tvm/relax_attention.py, which uses the Triton kernel with ``kernels``, a
    :class:`passctl.targets.tvm.triton_dispatch.TritonLibrary`, else TVM's ops)."""
    import_tvm()
    from tvm import relax

    op = relax.op

    def _const_like(x, value: float, n: int):
        dtype = str(x.ty.dtype)
        return relax.const(np.full((n,), value, dtype=dtype), dtype)

    def _last(x) -> int:
        return int(x.ty.shape[-1])

    def layer_norm(bb, inputs, attrs, x=None):
        x = inputs[0] if x is None else x
        scale = inputs[1] if len(inputs) > 1 and inputs[1] is not None else _const_like(x, 1, _last(x))
        bias = inputs[2] if len(inputs) > 2 and inputs[2] is not None else _const_like(x, 0, _last(x))
        return op.nn.layer_norm(x, scale, bias, axes=[-1], epsilon=float(attrs["epsilon"]))

    def skip_layer_norm(bb, inputs, attrs):
        s = op.add(inputs[0], inputs[1])
        if len(inputs) > 4 and inputs[4] is not None:
            s = op.add(s, inputs[4])
        rest = [None, inputs[2] if len(inputs) > 2 else None, inputs[3] if len(inputs) > 3 else None]
        return layer_norm(bb, rest, attrs, x=bb.normalize(s))

    def rms_norm(bb, inputs, attrs):
        x = inputs[0]
        scale = inputs[1] if len(inputs) > 1 and inputs[1] is not None else _const_like(x, 1, _last(x))
        return op.nn.rms_norm(x, scale, axes=[-1], epsilon=float(attrs["epsilon"]))

    def skip_rms_norm(bb, inputs, attrs):
        # (Y, S) as a Relax tuple when the node's sum output is used (the importer unpacks it by
        # the node's output count); S is bound once and read by both.
        s = bb.emit(op.add(inputs[0], inputs[1]))
        y = rms_norm(bb, [s, inputs[2] if len(inputs) > 2 else None], attrs)
        if attrs.get("tvm_custom", {}).get("num_outputs", 1) > 1:
            return relax.Tuple([bb.emit(y), s])
        return y

    def gelu(bb, inputs, attrs):
        v = inputs[0]
        if len(inputs) > 1 and inputs[1] is not None:
            v = op.add(v, inputs[1])
        approximate = attrs.get("approximate", b"none")
        approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
        return op.nn.gelu_tanh(v) if approximate == "tanh" else op.nn.gelu(v)

    def silu(bb, inputs, attrs):
        return op.nn.silu(inputs[0])

    def hard_swish(bb, inputs, attrs):
        x = inputs[0]
        dtype = str(x.ty.dtype)
        gate = op.clip(op.add(op.divide(x, relax.const(6.0, dtype)), relax.const(0.5, dtype)),
                       0.0, 1.0)
        return op.multiply(x, gate)

    table = {"LayerNorm": layer_norm, "SkipLayerNorm": skip_layer_norm, "RMSNorm": rms_norm,
             "SkipRMSNorm": skip_rms_norm, "Gelu": gelu, "SiLU": silu, "HardSwish": hard_swish}
    try:
        from passctl.targets.tvm.relax_attention import converters as attention_converters
    except ImportError:  # the attention package is optional here
        logger.debug("passctl::Attention converter not available")
    else:
        table.update(attention_converters(kernels))
    return table


def mapped_outputs(node: Node) -> int:
    """How many outputs of ``node`` the translation maps: all of an ONNX node's, the first of a
    passctl-domain node's (two of SkipRMSNorm's)."""
    if node.domain == PASSCTL_DOMAIN:
        return _MAPPED_OUTPUTS.get(node.op_type, 1)
    return len(node.outputs)


def supported_passctl_ops() -> List[str]:
    """The passctl-domain op types the translation maps to Relax ops."""
    return sorted(_converter_table())


def _onnx_ops() -> set:
    import_tvm()
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return set(_get_convert_map()) | _DIRECT


def unsupported_nodes(model: Model) -> List[Tuple[Node, str]]:
    """Every node the translation cannot handle, with the reason, in graph order (subgraphs too)."""
    onnx_ops, ours = _onnx_ops(), set(_converter_table())
    bad: List[Tuple[Node, str]] = []
    for node in model.graph.all_nodes():
        if node.domain in ("", "ai.onnx"):
            if node.op_type not in onnx_ops:
                bad.append((node, "TVM's Relax ONNX frontend has no converter for it"))
        elif node.domain == PASSCTL_DOMAIN:
            if node.op_type not in ours:
                bad.append((node, "the TVM emitter maps passctl::" + ", passctl::".join(sorted(ours))
                            + " only; add lower-standard to the pipeline"))
            elif any(o.uses() or o.is_graph_output()
                     for o in node.outputs[_MAPPED_OUTPUTS.get(node.op_type, 1):]):
                mapped = _MAPPED_OUTPUTS.get(node.op_type, 1)
                bad.append((node, "only its first output is mapped" if mapped == 1
                            else f"only its first {mapped} outputs are mapped"))
        else:
            hint = " (lowered for ONNX Runtime: use the pipeline's TVM form, lower-standard)" \
                if node.domain == "com.microsoft" else ""
            bad.append((node, f"domain '{node.domain}' is not supported by the TVM emitter{hint}"))
    return bad


def check_supported(model: Model, source: str = "model") -> None:
    """Raise before any TVM work when the model has a node the translation cannot handle.

    Raises:
        UserError: one line naming the first such node, its op, its provenance (the original
            model's node names) and the count of other unsupported nodes.
    """
    bad = unsupported_nodes(model)
    if not bad:
        return
    node, why = bad[0]
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    origin = ", ".join(node.provenance) if getattr(node, "provenance", None) else node.name
    more = f" (and {len(bad) - 1} more unsupported nodes: " \
        f"{', '.join(sorted({n.op_type for n, _ in bad[1:]}))})" if len(bad) > 1 else ""
    raise UserError(f"{source}: node '{node.name}' (op {op}, from {origin}) cannot be built for TVM: "
                    f"{why}{more}; change the pipeline or use --emit onnxruntime")


def check_static_inputs(model: Model, source: str = "model") -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """The static shape and dtype of every graph input (TVM artifacts are built for static shapes).

    Returns:
        ``{input name: (shape, numpy dtype name)}``.

    Raises:
        UserError: an input has an unknown rank or a symbolic dimension; the message says to fix it
            with ``lower-tvm{dims="NAME=SIZE,..."}`` (``INPUT[AXIS]=SIZE`` for unnamed dims).
    """
    result = {}
    for v in model.graph.inputs:
        shape = v.shape
        if v.dtype is None or shape is None:
            raise UserError(f"{source}: graph input '{v.name}' has no declared type or rank; TVM "
                            "artifacts need static input shapes")
        symbolic = [d for d in shape.dims if not (isinstance(d, int) and d >= 0)]
        if symbolic:
            # An unnamed dim ('?') has no name to give lower-tvm: its axis is named instead.
            names = ",".join(dict.fromkeys(
                f"{v.name}[{i}]=SIZE" if is_anonymous_dim(d) or isinstance(d, int) else f"{d}=SIZE"
                for i, d in enumerate(shape.dims) if not (isinstance(d, int) and d >= 0)))
            raise UserError(f"{source}: graph input '{v.name}' has symbolic dims {list(shape.dims)}; "
                            "TVM artifacts are built for static shapes: end the pipeline with "
                            f"'lower-tvm{{dims=\"{names}\"}}'")
        result[v.name] = (tuple(int(d) for d in shape.dims), np.dtype(v.dtype.numpy()).name)
    return result


class NodeConversionError(Exception):
    """TVM's frontend raised while converting one node (``node``: its name, ``op``: its type)."""

    def __init__(self, node: str, op: str, error: BaseException):
        first = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        # TVM prints an operator as its full ir.Op(...) repr: keep its name
        first = re.sub(r'ir\.Op\(.*?name="([^"]+)".*?support_level=\d+\)', r"\1", first)
        super().__init__(f"node '{node}' (op {op}): {first}")
        self.node, self.op = node, op


#: Initializers of these element types, or with at most this many elements, become Constant nodes
#: (Relax constants) instead of weights: TVM's converters read shapes, axes and indices only from
#: constants (Reshape with a shape that is a function parameter fails "Reshape requires the input
#: new shape to be Shape").
SMALL_CONSTANT_ELEMENTS = 64


def _constants_as_nodes(graph) -> None:
    """Move integer, boolean and small initializers of ``graph`` into Constant nodes (in place)."""
    import onnx

    keep, moved = [], []
    for init in graph.initializer:
        numel = int(np.prod(init.dims)) if len(init.dims) else 1
        floating = init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                      onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
        if floating and numel > SMALL_CONSTANT_ELEMENTS:
            keep.append(init)
        else:
            moved.append(onnx.helper.make_node("Constant", [], [init.name], value=init,
                                               name=f"passctl_constant_{len(moved)}"))
    if not moved:
        return
    del graph.initializer[:]
    graph.initializer.extend(keep)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(moved + nodes)


def to_relax(model: Model, source: str = "model", kernels=None):
    """Translate ``model`` (static input shapes) to a Relax IRModule with weights as parameters.

    Route: ``passctl.ir.to_onnx`` -> TVM 0.27's Relax ONNX frontend (``keep_params_in_input``),
    with passctl-domain ops converted by :func:`_converter_table` (nn.layer_norm, nn.rms_norm,
    SkipRMSNorm as add + nn.rms_norm with the sum as its second output,
    nn.gelu / gelu_tanh, nn.silu, HardSwish as x * clip(x / 6 + 1/2, 0, 1), Attention through
    targets/tvm/relax_attention.py, with ``kernels`` (a
    :class:`passctl.targets.tvm.triton_dispatch.TritonLibrary`) for CUDA builds that embed Triton
    kernels).

    Returns:
        ``(mod, params)``: the IRModule whose ``main`` takes the graph inputs then the weights, and
        ``params`` (list of ``tvm.runtime.Tensor``) in parameter order.

    Raises:
        UserError: unsupported nodes or symbolic input shapes (see :func:`check_supported`,
            :func:`check_static_inputs`); reported before TVM is called.
    """
    check_supported(model, source)
    inputs = check_static_inputs(model, source)
    import_tvm()
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    from passctl.ir import to_onnx

    proto = to_onnx(model)
    renamed = safe_value_names(proto.graph)  # CUDA kernels print buffer names as C identifiers
    inputs = {renamed.get(k, k): v for k, v in inputs.items()}
    _constants_as_nodes(proto.graph)
    for node in proto.graph.node:
        if node.domain == PASSCTL_DOMAIN:
            node.op_type = _PREFIX + node.op_type
            node.domain = ""
    table = _converter_table(kernels)

    class _Importer(ONNXGraphImporter):
        def _check_for_unsupported_ops(self, graph):  # done on the IR, with provenance
            return None

        def _convert_operator(self, op_name, inputs, attrs, opset):
            try:
                if op_name.startswith(_PREFIX):
                    return self.bb.normalize(table[op_name[len(_PREFIX):]](self.bb, inputs, attrs))
                return super()._convert_operator(op_name, inputs, attrs, opset)
            except Exception as e:
                name = attrs.get("tvm_custom", {}).get("name", "?")
                raise NodeConversionError(name, op_name, e) from e

    importer = _Importer({k: list(s) for k, (s, _) in inputs.items()},
                         {k: d for k, (_, d) in inputs.items()}, keep_params_in_input=True,
                         sanitize=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = importer.from_onnx(proto.graph, model.opset)
    mod, params = relax.frontend.detach_params(mod)
    return mod, list(params.get("main", []))


__all__ = ["check_static_inputs", "check_supported", "mapped_outputs", "supported_passctl_ops", "to_relax",
           "unsupported_nodes"]
