"""External data: import memory-maps without reading, save copies in chunks, writes are atomic."""

from __future__ import annotations

import os

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

import passctl.ir.onnx_export as onnx_export
from passctl.ir import load, save, to_onnx
from passctl.ir.errors import UserError
from passctl.support.check import run_onnxruntime

from proto_diff import proto_diff


def _external_model(folder, location="weights.bin") -> str:
    """x[2,64] @ W[64,16] + b[16]: W (4 KiB) external in ``location``, b embedded (64 bytes)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm"),
         helper.make_node("Add", ["xw", "b"], ["y"], name="add")], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        initializer=[onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=100)
    return path


def _inputs():
    return {"x": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}


def test_import_maps_external_data_without_reading(tmp_path):
    src = _external_model(str(tmp_path))
    model = load(src)
    w = model.graph.initializers["W"].const
    assert w.external is not None and w.external.location == "weights.bin"
    assert w._array is None  # nothing read at import
    assert model.graph.initializers["b"].const.external is None


def test_external_round_trip_to_another_folder(tmp_path):
    (tmp_path / "a").mkdir()
    src = _external_model(str(tmp_path / "a"))
    out_dir = tmp_path / "b"
    out_dir.mkdir()
    out = str(out_dir / "copy.onnx")
    model = load(src)
    save(model, out)  # external by default: the source had external data
    saved = onnx.load(out, load_external_data=False)
    w = next(t for t in saved.graph.initializer if t.name == "W")
    assert w.data_location == TensorProto.EXTERNAL
    assert {e.key: e.value for e in w.external_data}["location"] == "copy.onnx.data"
    assert os.path.isfile(out_dir / "copy.onnx.data")
    assert not proto_diff(onnx.load(src), onnx.load(out))
    assert not proto_diff(onnx.load(src), to_onnx(model))
    ref = run_onnxruntime(src, _inputs())
    got = run_onnxruntime(out, _inputs())
    assert np.array_equal(ref["y"], got["y"])


def test_save_over_the_files_the_model_maps(tmp_path):
    """Saving onto the source model and its own data file replaces them atomically; the model's
    tensors keep reading the right bytes afterwards."""
    src = _external_model(str(tmp_path))
    ref = run_onnxruntime(src, _inputs())
    model = load(src)
    w_before = np.array(model.graph.initializers["W"].const.numpy())
    save(model, src, external_data=True, location="weights.bin", size_threshold=32)
    assert np.array_equal(run_onnxruntime(src, _inputs())["y"], ref["y"])
    # b (64 bytes) moved into weights.bin too; W was re-pointed at its new offset.
    assert np.array_equal(model.graph.initializers["W"].const.numpy(), w_before)
    save(model, src, external_data=False)
    assert np.array_equal(run_onnxruntime(src, _inputs())["y"], ref["y"])
    assert sorted(os.listdir(tmp_path)) == ["model.onnx", "weights.bin"]  # no temp files left


def test_embedded_save_equals_to_onnx(tmp_path):
    src = _external_model(str(tmp_path))
    model = load(src)
    out = str(tmp_path / "embedded.onnx")
    save(model, out, external_data=False)
    loaded = onnx.load(out)
    assert all(t.data_location != TensorProto.EXTERNAL for t in loaded.graph.initializer)
    assert loaded.SerializeToString(deterministic=True) == \
        to_onnx(model).SerializeToString(deterministic=True)


def test_failed_save_leaves_the_target_untouched(tmp_path, monkeypatch):
    src = _external_model(str(tmp_path))
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    model = load(src)

    def broken(f, chunks):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(onnx_export, "write_graph_tail", broken)
    with pytest.raises(OSError, match="disk full"):
        save(model, src, external_data=False)
    after = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert after == before


@pytest.mark.slow
def test_model_over_2gb_from_a_sparse_file_imports_without_reading(tmp_path):
    """A 2.2 GB external initializer (a sparse file: no real disk or RAM) imports with a small RSS
    growth and saves with external data, holes kept."""
    count = 550_000_000  # float32 -> 2.2e9 bytes
    nbytes = count * 4
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    data = src_dir / "big.bin"
    with open(data, "wb") as f:
        f.truncate(nbytes)
        f.write(np.arange(4, dtype=np.float32).tobytes())  # real bytes at both ends
        f.seek(nbytes - 16)
        f.write(np.array([5, 6, 7, 8], np.float32).tobytes())
    big = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[count])
    big.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "big.bin"), ("offset", "0"), ("length", str(nbytes))):
        big.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("Shape", ["big"], ["s"], name="shape")], "big",
                              [], [helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
                              initializer=[big])
    src = str(src_dir / "model.onnx")
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)

    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    model = load(src)
    assert proc.memory_info().rss - rss0 < 64 << 20
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = str(out_dir / "model.onnx")
    save(model, out)  # over 1.8 GB: external by default
    assert proc.memory_info().rss - rss0 < 128 << 20
    out_data = out_dir / "model.onnx.data"
    assert out_data.stat().st_size == nbytes
    assert out_data.stat().st_blocks * 512 < 1 << 20  # the holes stayed holes
    copied = np.memmap(out_data, dtype=np.float32, mode="r")
    assert np.array_equal(copied[:4], [0, 1, 2, 3]) and np.array_equal(copied[-4:], [5, 6, 7, 8])
    reloaded = load(out)
    assert reloaded.graph.initializers["big"].const.external.location == "model.onnx.data"


@pytest.mark.parametrize("location", ["../escape.bin", "/tmp/absolute.bin"])
def test_save_refuses_a_location_outside_the_folder(tmp_path, location):
    model = load(_external_model(str(tmp_path)))
    with pytest.raises(UserError, match="relative to the model's folder"):
        save(model, str(tmp_path / "out.onnx"), external_data=True, location=location)
    assert not (tmp_path / "out.onnx").exists()


def test_save_into_a_data_subfolder(tmp_path):
    model = load(_external_model(str(tmp_path)))
    out = str(tmp_path / "out.onnx")
    save(model, out, external_data=True, location="data/weights.bin")
    assert (tmp_path / "data" / "weights.bin").is_file()
    assert np.array_equal(run_onnxruntime(out, _inputs())["y"],
                          run_onnxruntime(str(tmp_path / "model.onnx"), _inputs())["y"])


def test_to_onnx_keep_external_references_the_source_files(tmp_path):
    """to_onnx(keep_external=True) writes the source's external weights as the references they
    were read from (no bytes), embeds the rest, and from_onnx maps them again to equal values
    (what quantize's raise_opset hands onnx's version converter)."""
    from passctl.ir import from_onnx

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    small = np.arange(3, dtype=np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "h"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(small, "S")])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, str(tmp_path / "m.onnx"), save_as_external_data=True, location="w.bin",
              size_threshold=1024)
    model = load(str(tmp_path / "m.onnx"))
    model.graph.add_constant(np.ones(4, np.float32), "extra")  # in memory: embedded
    skeleton = to_onnx(model, keep_external=True)
    inits = {t.name: t for t in skeleton.graph.initializer}
    assert inits["W"].data_location == TensorProto.EXTERNAL and not inits["W"].raw_data
    entries = {e.key: e.value for e in inits["W"].external_data}
    assert entries["location"] == "w.bin" and int(entries["length"]) == w.nbytes
    assert inits["S"].data_location != TensorProto.EXTERNAL
    assert inits["extra"].data_location != TensorProto.EXTERNAL
    back = from_onnx(skeleton, str(tmp_path))
    assert back.graph.initializers["W"].const.external is not None
    assert np.array_equal(back.graph.initializers["W"].const.numpy(), w)
    assert np.array_equal(back.graph.initializers["extra"].const.numpy(), np.ones(4, np.float32))
    full = to_onnx(model)  # the default still embeds everything
    assert all(t.data_location != TensorProto.EXTERNAL for t in full.graph.initializer)
