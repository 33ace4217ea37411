"""Golden tests: every tests/golden/<pass-or-family>/*.pir through its RUN line (``passctl opt``),
compared with its EXPECTED section by structural equality, and the two sections compared on ONNX
Runtime; plus proof that a changed output fails. The test never rewrites a golden file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from golden_files import (DEFAULT_RTOL, EXPECTED, compare, golden_files, numeric_error, read_golden,
                          run_argv, run_opt)

from passctl.ir import Tensor
from passctl.passes import expand_alias, get_pass, list_aliases, register_pass

FILES = golden_files()
IDS = [f"{p.parent.name}/{p.name}" for p in FILES]
UPDATE = "python tests/golden/golden_files.py --update"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_opt_output_matches_expected(path):
    golden = read_golden(path)
    assert golden.expected_text is not None, f"{path}: no '{EXPECTED}' section; run {UPDATE} {path}"
    problem = compare(run_opt(golden), golden.expected_text, str(path))
    assert problem is None, f"{problem}\n(if the change is intended: {UPDATE} {path})"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_expected_computes_what_the_input_computes(path):
    """Numeric truth beside each golden: the input and the EXPECTED IR give the same outputs on
    ONNX Runtime for seeded random inputs (max |a - b| / max |a|; 1e-5 for fp32 passes, the
    file's NUMERIC bound for amp / quantize), on two seeds."""
    golden = read_golden(path)
    for seed in (0, 1):
        err = numeric_error(golden, seed)
        assert err <= golden.rtol, f"{path}: seed {seed}: max-rel error {err:.3g} > {golden.rtol:g}"


def test_every_golden_says_what_it_catches_and_fp32_bounds_stay_tight():
    for path in FILES:
        golden = read_golden(path)
        assert len(golden.catches) > 40, f"{path}: the CATCHES comment says too little"
        assert run_argv(golden)[:2] == ["opt", str(path)]
        if not any(p in golden.run for p in ("amp", "quantize")):
            assert golden.rtol == DEFAULT_RTOL, f"{path}: an fp32 pass needs rtol {DEFAULT_RTOL}"


def test_every_pass_of_every_group_has_a_golden():
    """Each pass that a group runs on the cpu target (every fusion family, attention, reparam, amp,
    quantize, cleanup and the ONNX Runtime lowering) appears in some RUN line's pipeline."""
    from passctl.tools.opt import pipeline_passes

    covered = set()
    for path in FILES:
        argv = run_argv(read_golden(path))
        opts = dict(zip(argv[2::2], argv[3::2]))
        covered |= {p.name for p in pipeline_passes(opts["-p"], opts.get("--target", "cpu"),
                                                    opts.get("--emit"))}
    wanted = {name for alias in list_aliases() for name in expand_alias(alias, "cpu")}
    assert wanted - covered == set()
    assert {"fuse-gemm-standard", "lower-standard"} <= covered


def _copy(path: Path, tmp_path: Path) -> Path:
    dst = tmp_path / path.parent.name / path.name
    dst.parent.mkdir()
    shutil.copy(path, dst)
    return dst


def test_a_changed_expected_value_fails_with_a_readable_diff(tmp_path):
    src = Path(__file__).parent / "fuse-conv-bn" / "conv_bn.pir"
    path = _copy(src, tmp_path)
    text = path.read_text()
    # one folded weight, last digit changed (the next float32 up) in the EXPECTED section only
    assert text.count("0.53019756") == 1
    path.write_text(text.replace("0.53019756", "0.5301976"))
    golden = read_golden(path)
    problem = compare(run_opt(golden), golden.expected_text, str(path))
    assert problem is not None
    first, *diff = problem.splitlines()
    assert "input 1 (initializer): tensor data differs" in first
    assert "--- expected" in diff and "+++ actual" in diff
    assert any(ln.startswith("-") and "0.5301976" in ln for ln in diff)
    assert any(ln.startswith("+") and "0.53019756" in ln for ln in diff)


def test_a_changed_expected_attribute_fails(tmp_path):
    path = _copy(Path(__file__).parent / "fuse-layernorm" / "layernorm.pir", tmp_path)
    head, expected = path.read_text().split(EXPECTED)
    path.write_text(head + EXPECTED + expected.replace("epsilon = 1e-05", "epsilon = 1e-06"))
    golden = read_golden(path)
    problem = compare(run_opt(golden), golden.expected_text, str(path))
    assert problem is not None
    assert "node 0 (passctl::LayerNorm) attribute 'epsilon': value" in problem.splitlines()[0]
    assert "-    %3: f32[2,4] = passctl::LayerNorm(%0, %1, %2) {axis = -1, epsilon = 1e-06}" in problem


def test_a_pass_whose_output_changes_by_one_ulp_fails_its_golden():
    """A fuse-conv-bn that folds the bias one float32 ulp off (numerically invisible at 1e-5) makes
    the unchanged golden file fail; the real pass makes it pass again."""
    path = Path(__file__).parent / "fuse-conv-bn" / "conv_bn.pir"
    golden = read_golden(path)
    original = get_pass("fuse-conv-bn")

    class OneUlpOff(original):
        def run(self, model):
            result = super().run(model)
            conv = next(n for n in model.graph if n.op_type == "Conv")
            bias = conv.inputs[2]
            bias.const = Tensor(np.nextafter(bias.const.numpy(), np.float32(np.inf)))
            return result

    register_pass(OneUlpOff, replace=True)
    try:
        problem = compare(run_opt(golden), golden.expected_text, str(path))
    finally:
        register_pass(original, replace=True)
    assert problem is not None and "tensor data differs" in problem
    assert compare(run_opt(golden), golden.expected_text, str(path)) is None


def test_a_dropped_pass_fails_the_golden(tmp_path):
    """The same file with fuse-gelu taken out of its RUN line: the decomposed formula stays; the
    first difference is the missing passctl opset import, and the diff shows the formula."""
    path = _copy(Path(__file__).parent / "fuse-gelu" / "gelu_erf.pir", tmp_path)
    path.write_text(path.read_text().replace("infer-shapes,fuse-gelu,dce", "infer-shapes,dce"))
    golden = read_golden(path)
    problem = compare(run_opt(golden), golden.expected_text, str(path))
    assert problem is not None and "model: opset_imports" in problem.splitlines()[0]
    diff = problem.splitlines()[1:]
    assert any(ln.startswith("-") and "passctl::Gelu(" in ln for ln in diff)
    assert any(ln.startswith("+") and "Erf(" in ln for ln in diff)
