"""Helpers of the reparam tests: run the `reparam` pipeline, count ops, export small torch blocks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Dict, Tuple, Union

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser

from passctl.ir import from_onnx, load, to_onnx
from passctl.passes.manager import ManagerResult, PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.support.check import compare, run_onnxruntime
from passctl.support.inputs import make_inputs

ModelIn = Union[str, onnx.ModelProto]


def run_reparam(model: ModelIn, pipeline: str = "cleanup,reparam") -> Tuple[onnx.ModelProto, ManagerResult]:
    """Import ``model``, run ``pipeline`` through the PassManager (verify-each is on in these tests),
    export; returns the exported proto (checked by onnx.checker) and the manager's result, whose
    ``reparam_pass`` attribute is the reparam-branches pass object (its ``unmerged`` reasons)."""
    ir_model = load(model) if isinstance(model, str) else from_onnx(model)
    passes = build_pipeline(pipeline)
    result = PassManager(passes).run(ir_model)
    result.reparam_pass = next((p for p in passes if p.name == "reparam-branches"), None)
    out = to_onnx(ir_model)
    onnx.checker.check_model(out)
    return out, result


def reparam_stats(result: ManagerResult) -> Dict:
    """The statistics of the reparam-branches run (the last one in the pipeline)."""
    return [r for r in result.records if r.name == "reparam-branches"][-1].stats


def op_counts(model: ModelIn) -> Counter:
    """Op type -> count over the main graph."""
    proto = onnx.load(model, load_external_data=False) if isinstance(model, str) else model
    return Counter(n.op_type for n in proto.graph.node)


def max_rel(reference: ModelIn, candidate: ModelIn, seed: int = 0) -> float:
    """Worst relative error (max |a - b| / max |a|, per output) of ``candidate`` against ``reference``
    in ONNX Runtime (no graph optimizations) on seeded random inputs."""
    ref = onnx.load(reference) if isinstance(reference, str) else reference
    feeds = make_inputs(ref, seed=seed)
    result = compare(run_onnxruntime(reference, feeds), run_onnxruntime(candidate, feeds))
    assert all(d.problem is None and d.nonfinite_mismatch == 0 for d in result.outputs.values()), \
        str(result.to_dict())
    return result.max_rel


def export_block(module, path: Path, shape=(1, 8, 12, 12), seed: int = 0) -> str:
    """Export a torch block (eval mode; BN statistics, affine parameters and epsilon randomized per
    BN) with BatchNormalization kept, and check the exported BNs are in inference form."""
    import torch

    torch.manual_seed(seed)
    bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for i, m in enumerate(bns):
            m.eps = (1e-5, 1e-3, 1e-2, 1e-4)[i % 4]  # each BN its own epsilon
            c = m.num_features
            m.weight.copy_(torch.rand(c) + 0.5)
            m.bias.copy_(torch.randn(c) * 0.5)
            m.running_mean.copy_(torch.randn(c) * 0.5)
            m.running_var.copy_(torch.rand(c) * 1.5 + 0.5)
    module.eval()
    torch.onnx.export(module, (torch.randn(*shape),), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"],
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    proto = onnx.load(str(path))
    nodes = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert nodes and all(len(n.output) == 1 for n in nodes)  # inference form: one output
    assert all(a.i == 0 for n in nodes for a in n.attribute if a.name == "training_mode")
    return str(path)


def parsed_with_weights(text: str, seed: int = 0, data_inputs=("x",)) -> onnx.ModelProto:
    """An onnx.parser model whose graph inputs other than ``data_inputs`` become initializers with
    seeded random values of their declared shapes (names containing ``var``: uniform in [0.5, 2],
    BN variances; others standard normal). Checked by onnx.checker."""
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    keep = []
    for inp in proto.graph.input:
        if inp.name in data_inputs:
            keep.append(inp)
            continue
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        arr = rng.uniform(0.5, 2.0, shape) if "var" in inp.name else rng.normal(size=shape)
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr.astype(np.float32), inp.name))
    del proto.graph.input[:]
    proto.graph.input.extend(keep)
    onnx.checker.check_model(proto, full_check=True)
    return proto
