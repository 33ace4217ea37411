"""Faults of the environment, not passctl's (issue 15 bug 10, build item 7): a killed run's staging
folder is removed by the next run into the same -o; a full disk is exit 4 with one line, no
reproducer and nothing left behind; bad options and bad files are one-line user errors."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from passctl.tools.cli import EXIT_ENVIRONMENT, main


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _model(w: onnx.TensorProto = None) -> onnx.ModelProto:
    """x[4, 4] + w -> Relu -> y."""
    if w is None:
        w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["a"], name="add0"),
         helper.make_node("Relu", ["a"], ["y"], name="relu0")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def model(tmp_path) -> str:
    path = str(tmp_path / "m.onnx")
    onnx.save(_model(), path)
    return path


def _hidden(folder, out_name: str):
    return sorted(n for n in os.listdir(folder) if n.startswith(f".{out_name}."))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- a killed run -------------------------------------------------------------------------------
def test_a_run_killed_during_emit_leaves_a_staging_folder_the_next_run_removes(tmp_path, model):
    """A real kill -9: the child writes the artifact into its staging folder and SIGKILLs itself
    before publishing; the next run into the same -o removes what it left."""
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import os, signal
        from passctl.targets.onnxruntime import emit
        from passctl.tools.cli import main
        write = emit.OnnxRuntimeEmitter.write
        def killed(self, *a, **k):
            info = write(self, *a, **k)
            os.kill(os.getpid(), signal.SIGKILL)
        emit.OnnxRuntimeEmitter.write = killed
        main([{model!r}, "-o", {str(out)!r}, "-q"])
    """)
    child = subprocess.run([sys.executable, "-c", script], env=dict(os.environ),
                           capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    left = _hidden(tmp_path, "out")
    assert len(left) == 1 and left[0].startswith(".out.tmp-")
    assert os.path.isfile(tmp_path / left[0] / "model.onnx") and not out.exists()
    r = subprocess.run([sys.executable, "-m", "passctl.tools.cli", model, "-o", str(out), "-q"],
                       env=dict(os.environ), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _hidden(tmp_path, "out") == [] and (out / "report.json").is_file()


def test_only_folders_of_dead_processes_are_removed(capsys, tmp_path, model):
    dead, live = _dead_pid(), os.getppid()  # the parent (pytest's shell or runner) is alive
    from passctl.targets.base import host_id

    here, elsewhere = host_id(), "0" * 8 if host_id() != "0" * 8 else "1" * 8
    for name in (f".out.tmp-{dead}.{here}-abc", f".out.old-{dead}.{here}-xyz",
                 f".out.tmp-{dead}-nohost", f".out.tmp-{live}.{here}-def", ".out.tmp-legacy",
                 f".out.tmp-{dead}.{elsewhere}-jkl", f".other.tmp-{dead}-ghi"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.onnx").write_bytes(b"partial")
    rc, _, err = _cli(capsys, model, "-o", tmp_path / "out", "-q")
    assert rc == 0, err
    assert _hidden(tmp_path, "out") == sorted([f".out.tmp-{live}.{here}-def", ".out.tmp-legacy",
                                               f".out.tmp-{dead}.{elsewhere}-jkl"])
    assert (tmp_path / f".other.tmp-{dead}-ghi").is_dir()  # another -o's: not ours to judge


def test_a_killed_runs_work_folder_in_the_temp_folder_is_removed(capsys, tmp_path, model,
                                                               monkeypatch):
    import tempfile

    from passctl.targets.base import host_id

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    dead = _dead_pid()
    (temp / f"passctl-work-{dead}.{host_id()}-abc").mkdir()
    (temp / f"passctl-work-{dead}.{host_id()}-abc" / "reference.onnx").write_bytes(b"x" * 100)
    (temp / f"passctl-work-{os.getppid()}.{host_id()}-def").mkdir()
    rc, _, err = _cli(capsys, model, "-o", tmp_path / "out", "-q")
    assert rc == 0, err
    assert sorted(os.listdir(temp)) == [f"passctl-work-{os.getppid()}.{host_id()}-def"]


# -- a full disk --------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_while_writing_the_artifact_is_an_environment_error(capsys, tmp_path, model,
                                                                        monkeypatch, code):
    from passctl.targets.onnxruntime import emit

    def full(model_ir, folder, threshold):
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as f:
            f.write(b"\x08\x08partial")  # what a real full disk leaves: a partial file
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(emit, "write_onnx", full)
    out, repro = tmp_path / "out", tmp_path / "repro"
    rc, _, err = _cli(capsys, model, "-o", out, "--reproducer-dir", repro, "-q")
    assert rc == EXIT_ENVIRONMENT == 4, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("passctl: environment error: "), err
    what = "no space is left on the device" if code == errno.ENOSPC else "the disk quota is exceeded"
    assert what in lines[0] and errno.errorcode[code] in lines[0] and "model.onnx" in lines[0]
    assert "internal error" not in err and "passctl: reproducer" not in err
    assert "Traceback" not in err
    assert not out.exists() and not repro.exists() and _hidden(tmp_path, "out") == []


def test_a_full_disk_inside_a_pass_leaves_no_reproducer(capsys, tmp_path, model):
    plugin = tmp_path / "full.py"
    plugin.write_text(textwrap.dedent("""
        import errno, os
        from passctl.passes.base import Pass
        from passctl.passes.registry import register_pass

        @register_pass(replace=True)
        class DiskFull(Pass):
            name = "test-disk-full"
            summary = "test only: a pass whose scratch file hits a full disk"

            def run(self, model):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/scratch/calib.onnx")
    """))
    out, repro = tmp_path / "out", tmp_path / "repro"
    rc, _, err = _cli(capsys, model, "--load", plugin, "-p", "test-disk-full", "-o", out,
                      "--reproducer-dir", repro, "-q")
    assert rc == 4, err
    assert err.count("passctl: ") == 1 and "'/scratch/calib.onnx'" in err
    assert not out.exists() and (not repro.exists() or os.listdir(repro) == [])


def test_a_full_disk_while_writing_a_reproducer_leaves_none(capsys, tmp_path, model,
                                                           monkeypatch):
    """The verify run fails (a test pass drops a rank) and the disk fills up while its
    reproducer is written: exit 4, and the half-written reproducer is removed."""
    from passctl.tools import reproducer

    def full(folder, report):
        with open(os.path.join(folder, "report.json"), "w") as f:
            f.write("{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(folder, "report.json"))

    monkeypatch.setattr(reproducer, "write_report", full)
    plugin = tmp_path / "drop.py"
    plugin.write_text(textwrap.dedent("""
        import numpy as np
        from passctl.ir import Node
        from passctl.passes.base import Pass, PassResult
        from passctl.passes.registry import register_pass

        @register_pass(replace=True)
        class Drop(Pass):
            name = "test-drop-axis"
            summary = "test only: Reshape the Relu input to 16 elements in one axis"

            def run(self, model):
                relu = next(n for n in model.graph if n.op_type == "Relu")
                shape = model.graph.add_constant(np.array([16], np.int64), "flat")
                r = Node("", "Reshape", [relu.inputs[0], shape], name="flatten")
                model.graph.insert_before(relu, r)
                relu.set_input(0, r.outputs[0])
                return PassResult(True, {})
    """))
    out, repro = tmp_path / "out", tmp_path / "repro"
    rc, _, err = _cli(capsys, model, "--load", plugin, "-p", "cleanup,test-drop-axis", "-o", out,
                      "--reproducer-dir", repro, "-q")
    assert rc == 4, err
    assert err.count("passctl: ") == 1 and "ENOSPC" in err and "report.json" in err
    assert not out.exists() and os.listdir(repro) == [] and _hidden(tmp_path, "out") == []


def test_exit_codes_are_in_the_help(capsys):
    rc, out, _ = _cli(capsys, "compile", "--help")
    assert rc == 0
    text = " ".join(out.split())
    assert "4 the environment's fault (a full disk or exhausted quota" in text
    assert "--no-verify" in text


# -- bad options and files ----------------------------------------------------------------------
@pytest.mark.parametrize("pipeline, pass_name, default", [
    ("fuse-attention{max_sweeps=0}", "fuse-attention", 2),
    ("fuse-gelu{max_sweeps=-3}", "fuse-gelu", 8),
])
def test_max_sweeps_below_one_is_refused(capsys, tmp_path, model, pipeline, pass_name, default):
    rc, _, err = _cli(capsys, model, "-p", pipeline, "-o", tmp_path / "out")
    assert rc == 2
    value = pipeline.split("=")[1].rstrip("}")
    assert err.strip() == (f"passctl: error: {pass_name}: max_sweeps={value} must be >= 1 (with "
                           "no sweep the pass applies no rule, silently; the default is "
                           f"{default})")


def _short(kind: str) -> onnx.TensorProto:
    """Initializer 'w' declaring dims [4, 4] with less data than that."""
    if kind == "raw":
        w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4])
        w.raw_data = b"\0" * 8
    elif kind == "float_data":
        w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [1.0] * 16)
        del w.float_data[10:]
    else:  # no data at all
        w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4])
    return w


@pytest.mark.parametrize("kind, said", [
    ("raw", "declares dims [4, 4] of float (64 bytes) but has 8 bytes of raw_data"),
    ("float_data", "declares dims [4, 4] of float (16 entries of float_data) but has 10 entries in float_data"),
    ("none", "declares dims [4, 4] of float (16 entries of float_data) but has no data"),
])
def test_an_initializer_without_its_declared_data_is_refused_at_import(capsys, tmp_path, kind,
                                                                       said):
    proto = _model(_short(kind))
    path = tmp_path / "short.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(Exception):  # ONNX Runtime refuses it too (the independent judge)
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rc, _, err = _cli(capsys, path, "-o", tmp_path / "out")
    assert rc == 2
    assert err.strip() == f"passctl: error: {path}: initializer 'w' {said}; the file is corrupt " \
                          "or was written wrongly: export the model again"
    assert not (tmp_path / "out").exists()


def test_complete_typed_and_int4_data_still_import(tmp_path):
    from passctl.ir.onnx_import import check_tensor_data

    check_tensor_data(helper.make_tensor("a", TensorProto.FLOAT, [2, 2], [1.0] * 4))
    check_tensor_data(helper.make_tensor("b", TensorProto.COMPLEX64, [2], [1 + 0j, 2 + 0j]))
    check_tensor_data(helper.make_tensor("c", TensorProto.FLOAT16, [3], [1.0, 2.0, 3.0]))
    check_tensor_data(helper.make_tensor("d", TensorProto.INT4, [3], [1, 2, 3]))
    check_tensor_data(numpy_helper.from_array(np.zeros((2, 3), np.int64), "e"))
    check_tensor_data(helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"b"]))
    short = helper.make_tensor("z", TensorProto.INT64, [3], [1, 2, 3])
    del short.int64_data[2:]
    with pytest.raises(ValueError, match="'z' declares dims \\[3\\] of int64"):
        check_tensor_data(short)
    half = helper.make_tensor("h", TensorProto.COMPLEX64, [2], [1 + 0j, 2 + 0j])
    del half.float_data[3:]
    with pytest.raises(ValueError, match="4 entries of float_data\\) but has 3"):
        check_tensor_data(half)


def test_a_fifo_as_external_data_is_named_as_what_it_is(capsys, tmp_path):
    proto = _model()
    path = tmp_path / "ext.onnx"
    onnx.save(proto, str(path), save_as_external_data=True, location="w.data", size_threshold=0)
    os.remove(tmp_path / "w.data")
    os.mkfifo(tmp_path / "w.data")
    rc, _, err = _cli(capsys, path, "-o", tmp_path / "out")
    assert rc == 2
    assert err.strip() == (f"passctl: error: {path}: tensor 'w': external-data file 'w.data' is a "
                           "FIFO (named pipe), not a regular file; give the weights as a regular "
                           "file next to the model")
    os.remove(tmp_path / "w.data")
    rc, _, err = _cli(capsys, path, "-o", tmp_path / "out")
    assert rc == 2 and "external-data file 'w.data' is missing" in err
