"""Target-independent cleanup passes: infer-shapes, fold-constants, dce, cse, eliminate-identity."""
