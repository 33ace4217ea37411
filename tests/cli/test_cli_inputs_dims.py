"""--inputs arrays and --dim names are checked against the graph inputs (fresh-user trial, H17)."""

from __future__ import annotations

import numpy as np
import onnx
from cli_helpers import conv_bn_proto


def _symbolic_model(tmp_path) -> str:
    """conv_bn with input x declared [batch, 3, ?, ?] (a named and two unnamed dims)."""
    proto = conv_bn_proto()
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param = "batch"
    for d in (dims[2], dims[3]):
        d.Clear()
    out = proto.graph.output[0].type.tensor_type.shape.dim
    for d in out:
        d.Clear()
    path = tmp_path / "sym.onnx"
    onnx.save(proto, str(path))
    return str(path)


def test_compile_inputs_with_wrong_dtype_or_shape_is_exit_2(cli, conv_bn_model, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((1, 3, 8, 8), np.float64))
    r = cli(conv_bn_model, "--check", "--inputs", bad, "-o", tmp_path / "o", "-q")
    assert r.rc == 2, r.err
    assert "input array 'x' (float64 [1, 3, 8, 8])" in r.err and "float32" in r.err
    np.savez(bad, x=np.zeros((1, 3, 9, 8), np.float32))
    r = cli(conv_bn_model, "--check", "--inputs", bad, "-o", tmp_path / "o", "-q")
    assert r.rc == 2 and "axis 2 is 9, the input declares 8" in r.err
    np.savez(bad, image=np.zeros((1, 3, 8, 8), np.float32))
    r = cli(conv_bn_model, "--check", "--inputs", bad, "-o", tmp_path / "o", "-q")
    assert r.rc == 2 and "['image'] name no graph input" in r.err and "['x']" in r.err
    assert not (tmp_path / "o").exists()


def test_run_inputs_with_wrong_shape_is_exit_2(cli, conv_bn_model, tmp_path):
    assert cli(conv_bn_model, "-o", tmp_path / "art", "-q").rc == 0
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((3, 8, 8), np.float32))
    r = cli("run", tmp_path / "art", "--inputs", bad, "--runs", "1")
    assert r.rc == 2, r.err
    assert "it has rank 3, the input rank 4" in r.err and "Traceback" not in r.err


def test_dim_names_that_match_nothing_are_errors(cli, tmp_path):
    model = _symbolic_model(tmp_path)
    for bad in ("y[2]=48", "x=32", "x[1]=3"):
        r = cli(model, "--check", "--dim", bad, "-o", tmp_path / "o", "-q")
        assert r.rc == 2, (bad, r.err)
        assert "matches no symbolic input dimension" in r.err
        assert "batch, x[0], x[2], x[3]" in r.err
    r = cli(model, "--check", "--dim", "batch=2", "--dim", "x[2]=12", "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err
    r = cli("run", tmp_path / "o", "--dim", "height=4", "--runs", "1")
    assert r.rc == 2 and "matches no symbolic input dimension" in r.err
    r = cli("run", tmp_path / "o", "--dim", "x[3]=4", "--runs", "1")
    assert r.rc == 0 and "y: [1, 4, 32, 4]" in r.out  # x[2] takes the NCHW default 32
