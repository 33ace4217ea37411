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


def load_model(spec: str) -> Tuple[Model, str]:
    """Load the MODEL argument: ONNX, or IR text when the file ends with ``.pir``.

    Returns:
        ``(model, path)`` with the resolved file path.

    Raises:
        UserError: as :func:`resolve_model_path`; the file is a folder; or the file does not load
            (``ModelLoadError`` / ``ParseError`` from the importer or parser, one line each; an
            initializer whose data does not match its dims and type is refused).
    """
    path = resolve_model_path(spec)
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
