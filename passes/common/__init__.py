"""Target-independent cleanup passes: infer-shapes, fold-constants, dce, cse, eliminate-identity."""

from passctl.passes.common.cse import CommonSubexpressionElimination
from passctl.passes.common.dce import DeadCodeElimination
from passctl.passes.common.eliminate_identity import EliminateIdentity
from passctl.passes.common.fold_constants import FoldConstants
from passctl.passes.common.infer_shapes import InferShapes, merge_types

__all__ = ["CommonSubexpressionElimination", "DeadCodeElimination", "EliminateIdentity",
           "FoldConstants", "InferShapes", "merge_types"]
