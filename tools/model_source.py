"""The CLI's MODEL argument: an .onnx file, IR text (.pir), or package:relative/path."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from typing import Tuple

from passctl.ir import Model
from passctl.ir.errors import UserError

logger = logging.getLogger(__name__)

_PACKAGE_SPEC = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):(.+)$")

#: File suffix of passctl's IR text form.
IR_TEXT_SUFFIX = ".pir"


def resolve_model_path(spec: str) -> str:
    """The file path that the MODEL argument ``spec`` names.

    ``spec`` is a path, or ``package:relative/path`` for a file shipped inside an installed Python
    package (found with ``importlib.util.find_spec``, which does not import the package).

    Raises:
        UserError: the file does not exist, the package is not installed, or the relative path
            leaves the package folder.
    """
    if os.path.exists(spec):
        return spec
    m = _PACKAGE_SPEC.match(spec)
    if m is None:
        raise UserError(f"model file '{spec}' not found; give the path of an .onnx or .pir "
                        "file, or package:relative/path for a file inside an installed package")
    package, rel = m.group(1), m.group(2)
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UserError(f"model '{spec}': package '{package}' is not installed; install it or give "
                        "a file path")
    if found.submodule_search_locations:
        roots = list(found.submodule_search_locations)
    elif found.origin:
        roots = [os.path.dirname(found.origin)]
    else:
        roots = []
    for root in roots:
        root = os.path.realpath(root)
        path = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([root, path]) != root:
            raise UserError(f"model '{spec}': '{rel}' leaves the folder of package '{package}'")
        if os.path.isfile(path):
            return path
    raise UserError(f"model '{spec}': package '{package}' has no file '{rel}' (looked in "
                    f"{', '.join(roots) or 'nowhere: the package has no folder'})")


#: ``path/to/file.py:function``: a Python file and a function returning ``(module, inputs)``.
_FACTORY_SPEC = re.compile(r"^(.+\.py):([A-Za-z_][A-Za-z0-9_]*)$")


class TorchSource:
    """A PyTorch model being compiled: the module (or exported program) and its example inputs.

    ``inputs`` is a tuple of tensors; ``names`` the exported ONNX graph's input names, in order."""

    def __init__(self, model, inputs, dynamic_dims=None):
        self.model, self.inputs, self.dynamic_dims = model, tuple(inputs), dynamic_dims
        self.names = []

    def feeds(self):
        """The example inputs as numpy arrays by ONNX input name."""
        return {n: t.detach().cpu().numpy() for n, t in zip(self.names, self.inputs)}


def describe_model_argument(spec) -> str:
    """What the report calls the MODEL argument: the path text, or the Python object's type."""
    if isinstance(spec, (str, os.PathLike)):
        return os.fspath(spec)
    if isinstance(spec, TorchSource):
        spec = spec.model
    return f"<{type(spec).__module__}.{type(spec).__name__}>"


def load_model(spec, workdir: str = ".") -> Tuple[Model, str]:
    """Load the MODEL argument: ONNX, IR text when the file ends with ``.pir``, a PyTorch model
    (``file.py:function``, a :class:`TorchSource`, an ``nn.Module`` or ``ExportedProgram``), or
    an in-memory :class:`Model` (copied: the passes never change the caller's model).

    ``workdir``: where a PyTorch export or a copy of an in-memory model is written (it must live
    as long as the returned model).

    Returns:
        ``(model, path)`` with the resolved file path (the exported ONNX file for PyTorch).

    Raises:
        UserError: as :func:`resolve_model_path`; the file is a folder; or the file does not load
            (``ModelLoadError`` / ``ParseError`` from the importer or parser, one line each; an
            initializer whose data does not match its dims and type is refused); or the PyTorch
            export fails or torch is missing.
    """
    if isinstance(spec, Model):
        from passctl.ir.onnx_export import save
        from passctl.ir.onnx_import import load

        path = os.path.join(workdir, "input.onnx")
        save(spec, path)
        return load(path), path
    torch_source = torch_source_of(spec)
    if torch_source is not None:
        from passctl.frontends.torch_module import import_torch

        model = import_torch(torch_source.model, torch_source.inputs, workdir,
                             dynamic_dims=torch_source.dynamic_dims)
        torch_source.names = [v.name for v in model.graph.inputs]
        logger.info("exported %s: %d nodes", describe_model_argument(spec), len(model.graph))
        return model, os.path.join(workdir, "model.onnx")
    if not isinstance(spec, (str, os.PathLike)):
        raise UserError(f"cannot compile a {type(spec).__name__}: give an .onnx or .pir path, a "
                        "passctl Model, a torch.nn.Module with example_inputs, or an "
                        "ExportedProgram")
    path = resolve_model_path(os.fspath(spec))
    if os.path.isdir(path):
        raise UserError(f"model '{path}' is a folder; give the path of an .onnx or .pir file")
    if path.endswith(IR_TEXT_SUFFIX):
        from passctl.ir.parser import parse_model

        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            with open(path, "rb") as f:
                head = f.read(64)
            looks_onnx = head[:1] == b"\x08"  # protobuf field 1 (ir_version), as ONNX files start
            what = "an ONNX (protobuf) file" if looks_onnx else "a binary file"
            raise UserError(f"{path}: looks like {what}, not IR text (.pir files are UTF-8 text)"
                            + ("; rename it to .onnx" if looks_onnx else ""))
        model = parse_model(text, path)
    else:
        from passctl.ir.onnx_import import load

        model = load(path, check_data=True)  # ONNX Runtime refuses a tensor short of data
    logger.info("loaded %s: %d nodes", path, len(model.graph))
    return model, path


def torch_source_of(spec) -> "TorchSource | None":
    """``spec`` as a :class:`TorchSource` when it names a PyTorch model (``FILE.py:FUNCTION`` is
    called here), else None.

    Raises:
        UserError: as :func:`passctl.frontends.torch_module.load_factory`.
    """
    from passctl.frontends.torch_module import is_torch_model, load_factory

    if isinstance(spec, TorchSource):
        return spec
    if is_torch_model(spec):
        return TorchSource(spec, ())
    if isinstance(spec, str) and _FACTORY_SPEC.match(spec) and not os.path.exists(spec):
        return TorchSource(*load_factory(spec))
    return None
