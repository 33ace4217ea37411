"""amp and targets: what each profile allows, the bf16-on-T4 refusal, typed (not emulated) GPU graphs."""

from __future__ import annotations

import onnx
import pytest

from amp_graphs import elem_types, layernorm_model, run_amp
from passctl.ir import from_onnx
from passctl.ir.errors import UserError
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline, format_pipeline
from passctl.passes.precision import target_support
from passctl.support.profiles import get_target, list_targets


def test_target_support_per_profile():
    expected = {"cpu": ["fp16", "bf16"], "t4": ["fp16"], "a10": ["fp16", "bf16"],
                "l4": ["fp16", "bf16"], "a100": ["fp16", "bf16"], "h100": ["fp16", "bf16"]}
    for name, dtypes in expected.items():
        support = target_support(get_target(name))
        assert support["dtypes"] == dtypes and support["emulated"] is (name == "cpu")
    for profile in list_targets():  # bf16 exactly from sm_80 on
        if profile.is_gpu:
            assert ("bf16" in target_support(profile)["dtypes"]) is (profile.compute_capability >= (8, 0))


def test_bf16_on_t4_is_refused():
    passes = build_pipeline("amp{dtype=bf16}", "t4")
    assert "target=t4" in format_pipeline(passes)  # --target reaches the pass
    model = from_onnx(layernorm_model())
    with pytest.raises(UserError) as info:
        PassManager(passes).run(model)
    message = str(info.value)
    assert "dtype=bf16 is not supported on target t4" in message and "sm_75" in message
    assert "sm_80" in message and "use dtype=fp16" in message and "\n" not in message


def test_explicit_target_option_wins():
    passes = build_pipeline("amp{dtype=bf16,target=a100}", "t4")
    assert next(p for p in passes if p.name == "mixed-precision").options.target == "a100"


@pytest.mark.parametrize("target,dtype,elem", [("a100", "bf16", onnx.TensorProto.BFLOAT16),
                                               ("t4", "fp16", onnx.TensorProto.FLOAT16)])
def test_gpu_targets_get_the_typed_graph(target, dtype, elem):
    proto, stats = run_amp(layernorm_model(), f"amp{{dtype={dtype},budget=5e-2,samples=1}}", target)
    assert stats["target"]["target"] == target and stats["emulated"] is False
    assert stats["emulated_nodes"] == 0
    types = elem_types(proto, strict=True)
    matmul = next(n for n in proto.graph.node if n.op_type == "MatMul")
    assert [types[i] for i in matmul.input] == [elem, elem] and types[matmul.output[0]] == elem
    assert not any(n.name.startswith("amp_emulate") for n in proto.graph.node)
