"""Target profiles: published GPU facts, lookup with suggestions, emitters that do not exist yet."""

import pytest

from passctl.ir.errors import UserError
from passctl.targets import emitter_names, get_emitter, get_target, list_targets

# (compute capability, memory in GB as marketed, fast dtypes) from NVIDIA's data sheets and
# architecture whitepapers (Turing: fp16/int8 tensor cores; Ampere: + tf32/bf16; Ada/Hopper: + fp8).
GPU_FACTS = {
    "t4": ((7, 5), 16, {"fp16", "int8"}),
    "a10": ((8, 6), 24, {"tf32", "fp16", "bf16", "int8"}),
    "l4": ((8, 9), 24, {"tf32", "fp16", "bf16", "int8", "fp8"}),
    "a100": ((8, 0), 80, {"tf32", "fp16", "bf16", "int8"}),
    "a100-40gb": ((8, 0), 40, {"tf32", "fp16", "bf16", "int8"}),
    "h100": ((9, 0), 80, {"tf32", "fp16", "bf16", "int8", "fp8"}),
    "h200": ((9, 0), 141, {"tf32", "fp16", "bf16", "int8", "fp8"}),
}


@pytest.mark.parametrize("name", sorted(GPU_FACTS))
def test_gpu_profile_facts(name):
    cc, gb, fast = GPU_FACTS[name]
    t = get_target(name)
    assert t.compute_capability == cc
    assert t.sm == f"sm_{cc[0]}{cc[1]}"
    assert t.memory_bytes == gb * 10**9
    assert set(t.fast_dtypes) == fast
    assert t.is_gpu
    assert t.default_emitter == "onnxruntime"
    assert t.ort_providers[0] == "CUDAExecutionProvider"
    assert t.ort_providers[-1] == "CPUExecutionProvider"
    assert "TensorrtExecutionProvider" in t.ort_optional_providers


def test_cpu_profile():
    t = get_target("CPU")
    assert t.name == "cpu" and not t.is_gpu and t.sm is None and t.memory_bytes is None
    assert t.ort_providers == ("CPUExecutionProvider",)
    assert t.ort_optional_providers == ()


def test_every_required_target_is_listed():
    names = [t.name for t in list_targets()]
    for required in ("cpu", "a10", "t4", "l4", "a100", "h100", "h200"):
        assert required in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize("typo, expected", [("a01", "a10"), ("h20", "h200"), ("tt4", "t4"),
                                            ("cpuu", "cpu")])
def test_unknown_target_suggests_close_names(typo, expected):
    with pytest.raises(UserError) as info:
        get_target(typo)
    msg = str(info.value)
    assert "\n" not in msg
    assert f"unknown target '{typo}'" in msg
    assert f"'{expected}'" in msg.split("known targets")[0]


def test_every_named_emitter_exists():
    assert emitter_names() == ["onnxruntime", "tvm", "tensorrt"]
    assert [get_emitter(name).name for name in emitter_names()] == emitter_names()


def test_unknown_emitter_suggests():
    with pytest.raises(UserError, match="did you mean 'onnxruntime'"):
        get_emitter("onnxruntim")
    assert get_emitter("onnxruntime").name == "onnxruntime"
