"""An invalid input model is a user error (exit 2) found before any pass (fresh-user trial, H17)."""

from __future__ import annotations

import onnx
from cli_helpers import conv_bn_proto
from onnx import helper


def test_unknown_default_domain_op_is_exit_2_naming_the_node(cli, tmp_path):
    proto = conv_bn_proto()
    proto.graph.node[3].op_type = "Frobnicate"
    path = tmp_path / "frob.onnx"
    onnx.save(proto, str(path))
    r = cli(path, "-o", tmp_path / "out", "-q")
    assert r.rc == 2, r.err
    assert "unknown-op" in r.err and "relu0" in r.err and "Frobnicate" in r.err
    assert not (tmp_path / "out").exists()


def test_undefined_input_is_exit_2(cli, tmp_path):
    proto = conv_bn_proto()
    proto.graph.node[3].input[0] = "nowhere"
    path = tmp_path / "undef.onnx"
    onnx.save(proto, str(path))
    r = cli(path, "-o", tmp_path / "out", "-q")
    assert r.rc == 2, r.err
    assert "nowhere" in r.err and "relu0" in r.err


def test_misspelled_op_in_ir_text_is_exit_2(cli, conv_bn_model, tmp_path):
    r = cli("show", conv_bn_model)
    assert r.rc == 0 and "Relu(" in r.out
    pir = tmp_path / "bad.pir"
    pir.write_text(r.out.replace("Relu(", "Softmaxx("))
    r = cli(pir, "-o", tmp_path / "out", "-q")
    assert r.rc == 2, r.err
    assert "Softmaxx" in r.err and "did you mean" in r.err


def test_custom_domain_op_still_compiles_to_the_emitter(cli, tmp_path):
    proto = conv_bn_proto()
    proto.graph.node[3].domain = "com.example"
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    path = tmp_path / "custom.onnx"
    onnx.save(proto, str(path))
    r = cli(path, "--pipeline", "dce", "-o", tmp_path / "out", "--reproducer-dir",
            tmp_path / "crash", "-q")  # the verifier lets it through; ONNX Runtime cannot load it
    assert "unknown-op" not in r.err and "invalid model" not in r.err
