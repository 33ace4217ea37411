"""Compilation targets: device profiles (cpu, NVIDIA GPUs) and the emitters that write artifacts."""

from passctl.support.profiles import FAST_DTYPES, TargetProfile, get_target, list_targets
from passctl.targets.base import Emitter, EmitError, atomic_output_dir
from passctl.targets.registry import emitter_names, get_emitter, register_emitter

__all__ = [
    "EmitError", "Emitter", "FAST_DTYPES", "TargetProfile", "atomic_output_dir", "emitter_names",
    "get_emitter", "get_target", "list_targets", "register_emitter",
]
