"""TVM availability and the ``tvm.target.Target`` passctl builds for each target profile."""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Dict

from passctl.ir.errors import UserError
from passctl.support.profiles import TargetProfile

logger = logging.getLogger(__name__)

#: The apache-tvm release this emitter is written and tested against.
TVM_VERSION = "0.27"


def import_tvm():
    """Import and return the ``tvm`` package.

    Raises:
        UserError: apache-tvm is not installed (the message says how to install it).
    """
    try:
        import tvm  # noqa: F401
    except ImportError as e:
        raise UserError("the TVM emitter needs apache-tvm: pip install -e '.[tvm]' in a passctl clone "
                        f"(apache-tvm=={TVM_VERSION}.0.post1); import failed: {e}") from e
    return tvm


def host_cpu_target() -> Dict[str, Any]:
    """The ``llvm`` target of this host as a dict (TVM 0.27 rejects ``"llvm -mcpu=..."`` strings).

    ``mcpu`` is LLVM's name of the host CPU (``llvm_get_system_cpu``, e.g. ``znver5``) so the code
    uses its vector width (AVX2 / AVX-512); ``num-cores`` is ``os.cpu_count()`` (TVM's thread pool
    and parallel loops use it).
    """
    import_tvm()
    from tvm.target import codegen

    return {"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu()),
            "mtriple": str(codegen.llvm_get_system_triple()), "num-cores": os.cpu_count() or 1}


def cuda_target(target: TargetProfile) -> Dict[str, Any]:
    """The ``cuda`` target for a GPU profile, with ``arch`` from its compute capability (``sm_90``).

    The host part (the Relax VM's host code) is generic ``llvm`` for x86-64, not this machine's
    CPU: the artifact runs on the GPU machine, whose CPU may lack this one's instructions.
    Shared memory and threads per block are given so DLight does not guess (and warn).
    """
    # max_shared_memory_per_block: the 48 KiB every CUDA GPU gives a block without opt-in (what
    # DLight assumes anyway; unset, it warns once per kernel); max_threads_per_block: 1024 on all
    # compute capabilities >= 2.0 (CUDA C++ Programming Guide, technical specifications).
    return {"kind": "cuda", "arch": target.sm, "max_shared_memory_per_block": 49152,
            "max_threads_per_block": 1024,
            "host": {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}}


def tvm_target(target: TargetProfile):
    """The ``tvm.target.Target`` for a passctl target profile: ``llvm`` for cpu, ``cuda`` for GPUs.

    Raises:
        UserError: a GPU profile on a machine with neither NVRTC (``cuda.bindings``, TVM 0.27's
            default CUDA compiler) nor ``nvcc`` on PATH (install ``cuda-python`` or the CUDA
            toolkit), or apache-tvm is missing.
    """
    import importlib.util

    tvm = import_tvm()
    if not target.is_gpu:
        return tvm.target.Target(host_cpu_target())
    try:
        has_nvrtc = importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:
        has_nvrtc = False
    if not has_nvrtc and shutil.which("nvcc") is None:
        raise UserError(f"target '{target.name}' ({target.sm}): TVM compiles CUDA kernels with "
                        "NVRTC (Python package cuda-python) or nvcc, and this machine has neither; "
                        "pip install cuda-python or put the CUDA toolkit's nvcc on PATH")
    return tvm.target.Target(cuda_target(target))


def attr_text(value) -> str:
    """An IR string attribute's value as ``str`` (the IR may hold it as ``bytes``)."""
    return value.decode() if isinstance(value, bytes) else str(value)
