"""Structural re-parameterization: multi-branch training-time conv blocks merged into one Conv."""

from passctl.passes.reparam.explain import explain_reparam
from passctl.passes.reparam.merge_branches import ReparamBranches

__all__ = ["ReparamBranches", "explain_reparam"]
