"""Input arrays from files: the ``.npz`` archives of ``--inputs`` (compile, run) and of
calibration folders (``calib=`` of amp and quantize)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from passctl.ir.errors import UserError
from passctl.support.errors import one_line

__all__ = ["load_input_file"]


def load_input_file(path: Optional[str]) -> Dict[str, Any]:
    """Arrays by input name from an ``.npz`` file (the ``--inputs`` option of compile and run);
    empty without a path.

    Returns:
        ``{array name: numpy array}`` with every array read into memory.

    Raises:
        UserError: the file is missing or unreadable, is not an ``.npz`` (zip) archive (a single
            ``.npy`` array or a text file), holds no arrays, or holds an array that is not a numeric
            ``.npy`` (Python objects, damaged data); the message names the file and the array.
    """
    if not path:
        return {}
    import zipfile

    import numpy as np

    how = "write it with numpy.savez(path, name=array, ...) using the graph input names"
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise UserError(f"--inputs '{path}': cannot read it ({e.strerror or e}); give an .npz file")
    if magic == b"\x93NUMPY":
        raise UserError(f"--inputs '{path}': a single array (.npy), not an .npz archive of arrays "
                        f"by input name; {how}")
    if not zipfile.is_zipfile(path):
        raise UserError(f"--inputs '{path}': not an .npz archive (not a zip file); {how}")
    arrays: Dict[str, Any] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            for name in names:
                try:
                    value = data[name]
                    if not isinstance(value, np.ndarray):  # a zip member that is no .npy: raw bytes
                        raise ValueError("no .npy header")
                    arrays[name] = value
                except ValueError as e:
                    if "allow_pickle" in str(e) or "pickled" in str(e):
                        problem = "holds Python objects (dtype object)"
                    else:
                        problem = f"is not a numeric .npy array ({one_line(e)})"
                    raise UserError(f"--inputs '{path}': array '{name}' {problem}; save numeric "
                                    f"arrays instead: {how}") from e
                except (OSError, EOFError, zipfile.BadZipFile) as e:
                    raise UserError(f"--inputs '{path}': array '{name}' is damaged "
                                    f"({one_line(e)}); {how}") from e
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise UserError(f"--inputs '{path}': not a readable .npz archive ({one_line(e)}); "
                        f"{how}") from e
    if not arrays:
        raise UserError(f"--inputs '{path}' holds no arrays (random inputs would be used "
                        f"instead); {how}")
    return arrays
