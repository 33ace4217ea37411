"""Layer-wise mixed precision (the ``amp`` alias): rules, calibration and search, Cast insertion."""

from passctl.passes.precision.amp import MixedPrecision, target_support
from passctl.passes.precision.casts import apply_precision, simplify_casts
from passctl.passes.precision.rules import LOW_DTYPES, layernorm_chains, rule_fp32_nodes
from passctl.passes.precision.sensitivity import measure, output_error, search_fp32_set

__all__ = ["LOW_DTYPES", "MixedPrecision", "apply_precision", "layernorm_chains", "measure",
           "output_error", "rule_fp32_nodes", "search_fp32_set", "simplify_casts", "target_support"]
