"""amp's measurement and search: ranges, per-node sensitivity, the bisection, the output metrics."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from amp_graphs import cancellation_model, run_amp
from passctl.ir import DataType, from_onnx
from passctl.ir.errors import UserError
from passctl.passes.common import InferShapes
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.passes.precision import measure, output_error, search_fp32_set
from passctl.passes.precision.sensitivity import calibration_inputs, group_estimates
from passctl.support.check import compare, run_onnxruntime


def test_search_finds_the_smallest_count_in_few_runs():
    calls = []

    def evaluate(k):
        calls.append(k)
        return 1.0 / (k + 1)

    result = search_fp32_set(list(range(1000)), evaluate, budget=0.01)
    assert result.count == 99 and result.within_budget and result.error == pytest.approx(0.01)
    assert len(calls) == len(set(calls)) <= 2 * int(np.log2(100)) + 3
    assert search_fp32_set(list(range(5)), lambda k: 0.0, 0.1).count == 0
    never = search_fp32_set(list(range(5)), lambda k: 1.0, 0.1)
    assert never.count == 5 and never.error == 0.0  # all searched nodes float32: graph unchanged


def test_group_estimates_share_a_group_error_by_squared_local_error():
    runs = []

    def evaluate_low(members):
        runs.append(tuple(members))
        return {(0, 1): 5e-3, (2,): 1e-3}[tuple(members)]

    local = {0: 3.0, 1: 4.0, 2: 7.0}
    est, measured = group_estimates({"MatMul": [0, 1], "Add": [2]}, local, evaluate_low, "mean-rel")
    assert runs == [(0, 1), (2,)] and measured == {"MatMul": 5e-3, "Add": 1e-3}
    assert est[0] == pytest.approx(5e-3 * 3 / 5) and est[1] == pytest.approx(5e-3 * 4 / 5)
    assert est[0] ** 2 + est[1] ** 2 == pytest.approx(5e-3 ** 2)  # squares add up to the group's
    assert est[2] == pytest.approx(1e-3)
    est, _ = group_estimates({"MatMul": [0, 1]}, local, lambda m: 5e-3, "cosine")
    assert est[0] == pytest.approx(5e-3 * 9 / 25) and est[1] == pytest.approx(5e-3 * 16 / 25)


def test_output_error_metrics_match_numpy_and_check():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((3, 50)).astype(np.float32)
    c = r + rng.standard_normal((3, 50)).astype(np.float32) * 1e-3
    assert output_error([{"y": r}], [{"y": c}], "max-rel") == pytest.approx(
        compare({"y": r}, {"y": c}).max_rel, rel=1e-6)
    assert output_error([{"y": r}], [{"y": c}], "mean-rel") == pytest.approx(
        np.abs(r - c).sum() / np.abs(r).sum(), rel=1e-6)
    r64, c64 = r.ravel().astype(np.float64), c.ravel().astype(np.float64)
    cos = np.dot(r64, c64) / np.linalg.norm(r64) / np.linalg.norm(c64)
    assert output_error([{"y": r}], [{"y": c}], "cosine") == pytest.approx(1 - cos, rel=1e-4)
    c[0, 0] = np.nan
    assert output_error([{"y": r}], [{"y": c}], "cosine") == float("inf")


def test_measure_ranges_and_sensitivity_ranking():
    proto = cancellation_model()
    model = from_onnx(proto)
    InferShapes().run(model)
    feeds = calibration_inputs(model, samples=2, seed=3)
    nodes = list(model.graph)
    m = measure(model, list(range(len(nodes))), DataType.FLOAT16, feeds)
    ref = ReferenceEvaluator(proto)
    for name in ("a", "b", "c", "y"):
        expected = max(np.abs(ref.run([name], f)[0]).max() for f in feeds)
        assert m.absmax[name] == pytest.approx(expected, rel=1e-6)
    assert m.absmax["x"] == pytest.approx(max(np.abs(f["x"]).max() for f in feeds))
    # Sub(Add(x, 1000), 1000) in fp16: spacing 0.5 near 1000, so b is off by up to 0.25
    assert max(m.max_rel, key=m.max_rel.get) == 1 and 0.1 < m.max_rel[1] < 0.5
    assert m.input_max_rel[1] > 0.1 and m.input_max_rel[0] < 1e-5
    assert all(m.max_rel[i] < 2e-3 for i in (0, 2, 3))


def test_search_keeps_the_cancelling_pair_fp32():
    proto = cancellation_model()
    out, stats = run_amp(proto, "amp{dtype=fp16,budget=1e-2,metric=max-rel}", "cpu")
    precision = {e["name"]: (e["precision"], e.get("why", "")) for e in stats["nodes"]}
    assert precision["Add@0"][0] == precision["Sub@1"][0] == "fp32"
    assert precision["Add@0"][1].startswith("measured sensitivity")
    assert precision["Mul@2"][0] == precision["Add@3"][0] == "fp16"
    search = stats["search"]
    assert search["history"][0][0] == 0 and search["history"][0][1] > 1e-2  # all fp16 fails
    assert search["fp32_by_search"] == 2 and search["within_budget"] and search["error"] <= 1e-2
    x = np.linspace(-1, 1, 64).astype(np.float32)
    got, want = run_onnxruntime(out, {"x": x})["y"], run_onnxruntime(proto, {"x": x})["y"]
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-2


def test_calibration_folder(tmp_path):
    model = from_onnx(cancellation_model())
    missing = tmp_path / "missing"
    with pytest.raises(UserError, match=f"^amp: calib={missing}: no such folder; ") as info:
        calibration_inputs(model, str(missing))
    assert "\n" not in str(info.value)
    (tmp_path / "file.npz").write_bytes(b"")
    with pytest.raises(UserError, match="is a file, not a folder"):
        calibration_inputs(model, str(tmp_path / "file.npz"))
    (tmp_path / "file.npz").unlink()
    with pytest.raises(UserError, match="no .npz files"):
        calibration_inputs(model, str(tmp_path))
    np.savez(tmp_path / "a.npz", z=np.zeros(64, np.float32))
    with pytest.raises(UserError, match=r"lacks inputs \['x'\]"):
        calibration_inputs(model, str(tmp_path))
    (tmp_path / "a.npz").unlink()
    for k in range(3):
        np.savez(tmp_path / f"{k}.npz", x=np.full(64, k, np.float32))
    feeds = calibration_inputs(model, str(tmp_path))
    assert [float(f["x"][0]) for f in feeds] == [0.0, 1.0, 2.0]


def test_run_model_with_external_data_for_large_weights(monkeypatch):
    from passctl.passes.precision import sensitivity

    model = from_onnx(cancellation_model())
    feeds = [{"x": np.linspace(-1, 1, 64).astype(np.float32)}]
    embedded = sensitivity.run_model(model, feeds)
    monkeypatch.setattr(sensitivity, "EMBED_LIMIT", 0)
    assert np.array_equal(sensitivity.run_model(model, feeds)[0]["y"], embedded[0]["y"])


def test_feeds_the_model_cannot_run_are_a_user_error(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros(63, np.float32))  # the model declares x: [64]
    model = from_onnx(cancellation_model())
    passes = build_pipeline(f"amp{{calib={tmp_path}}}", "cpu")
    with pytest.raises(UserError, match="cannot run the float32 model on the calibration feeds"):
        PassManager(passes).run(model)


def test_all_fp32_warning_names_random_feed_sizes_and_remedies(caplog):
    proto = cancellation_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "length"  # symbolic: x [length]
    with caplog.at_level("WARNING", logger="passctl.passes.precision.amp"):
        _, stats = run_amp(proto, "amp{dtype=fp16,budget=1e-9,metric=max-rel}", "cpu")
    assert stats["low_nodes"] == 0  # fp16 rounding of x alone is far above 1e-9
    warnings = [r.getMessage() for r in caplog.records if "is met only" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0]
    assert text.startswith("amp: max-rel 1e-09 is met only with every measured node in float32")
    # make_inputs' default for a 'len'-like dimension name is 16 (support/inputs.py DEFAULT_SEQUENCE)
    assert "seeded random data (no calib=) at default sizes length=16:" in text
    assert "calib=DIR" in text and 'dims="length=SIZE"' in text and "\n" not in text


def test_calibration_files_and_dims_are_checked(tmp_path):
    # NaN data, a non-zip file, an object array: one-line UserErrors naming the file (not rc 3)
    from passctl.passes.precision.amp import parse_dims

    model = from_onnx(cancellation_model())
    x = np.ones(64, np.float32)
    x[3] = np.nan
    np.savez(tmp_path / "a.npz", x=x)
    with pytest.raises(UserError, match=rf"^amp: calibration file {tmp_path}/a.npz: array 'x' "
                                        r"holds 1 NaN or inf values of 64; "):
        calibration_inputs(model, str(tmp_path))
    (tmp_path / "a.npz").write_text("text")
    with pytest.raises(UserError, match=rf"^amp: calibration file {tmp_path}/a.npz: not an .npz "):
        calibration_inputs(model, str(tmp_path))
    np.savez(tmp_path / "a.npz", x=np.array([None], dtype=object))
    with pytest.raises(UserError, match=r"array 'x' holds Python objects"):
        calibration_inputs(model, str(tmp_path))
    with pytest.raises(UserError, match=r"^amp: dims entry 'n=0': a size must be at least 1"):
        parse_dims("n=0")
    with pytest.raises(UserError, match=r"^amp\{dims=\"Q=2\"\}: dims name 'Q' matches no dim"):
        calibration_inputs(model, dims={"Q": 2})
    with pytest.raises(UserError, match=r"^amp: samples=2000 is above 1024"):
        calibration_inputs(model, samples=2000)
