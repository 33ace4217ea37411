"""The TVM emitter: passctl IR -> Relax -> a compiled library for llvm (cpu) or cuda (GPU profiles)."""

from passctl.targets.tvm.emit import TvmEmitter, TvmTranslationError
from passctl.targets.tvm.runtime import TvmArtifact, is_tvm_artifact, load_artifact

__all__ = ["TvmArtifact", "TvmEmitter", "TvmTranslationError", "is_tvm_artifact", "load_artifact"]
