"""A ``--load`` plugin pass that is wrong on purpose (for the --check-each tests): it sets every
``passctl::LayerNorm``'s epsilon to 1e-5, whatever the model said. Its output still holds
passctl-only ops, so ``--check-each`` can check it only through their standard lowering."""

from passctl.passes.base import Pass, PassResult
from passctl.passes.registry import register_pass


@register_pass
class WrongPassctlEpsilon(Pass):
    name = "wrong-passctl-epsilon"
    summary = "passctl::LayerNorm epsilon -> 1e-5 (WRONG on purpose)"

    def run(self, model):
        hit = 0
        for node in model.graph:
            if node.domain == "passctl" and node.op_type == "LayerNorm":
                node.set_attr("epsilon", 1e-5)
                hit += 1
        return PassResult(bool(hit), {"changed": hit})
