"""passctl passes: the Pass API, the registry, pipeline text and the pass manager.

The built-in passes (``passes/common``, ``passes/fusion``) register themselves when the registry
first looks a name up (see ``registry._builtin_modules``), so importing this package stays cheap.
"""

from passctl.passes.base import Pass, PassResult, PostconditionError, PreconditionError
from passctl.passes.manager import (FixpointGroup, ManagerResult, PassFailure, PassManager, PassRecord,
                                    VerifyError)
from passctl.passes.pipeline_text import (PassSpec, PipelineSyntaxError, build_pipeline, format_pipeline,
                                          parse_pipeline)
from passctl.passes.registry import (UnknownPassError, expand_alias, expand_names, get_pass, is_alias,
                                     list_aliases, list_passes, load_plugin_file, register_pass)

__all__ = [
    "FixpointGroup", "ManagerResult", "Pass", "PassFailure", "PassManager", "PassRecord", "PassResult",
    "PassSpec", "PipelineSyntaxError", "PostconditionError", "PreconditionError", "UnknownPassError",
    "VerifyError", "build_pipeline", "expand_alias", "expand_names", "format_pipeline", "get_pass",
    "is_alias", "list_aliases", "list_passes", "load_plugin_file", "parse_pipeline", "register",
    "register_pass",
]

#: ``passctl.passes.register``: the decorator that registers a :class:`Pass` subclass by name.
register = register_pass

# The rule API (``passctl.passes.RewriteRule``, ``PatternBuilder``, ``register_rule``, ...), imported
# from passctl.passes.rewrite on first use.
_REWRITE_NAMES = ("AttrVar", "ConstantPattern", "MatchResult", "Opt", "Or", "PatternBuilder",
                  "Replacement", "RewriteRule", "RuleContext", "RuleSet", "constant_value",
                  "register_rule", "register_rule_set")


def __getattr__(name):
    if name in _REWRITE_NAMES:
        from passctl.passes import rewrite

        return getattr(rewrite, name)
    raise AttributeError(f"module 'passctl.passes' has no attribute '{name}'")
