"""passctl passes: the Pass API, the registry, pipelines and the pass manager."""

from passctl.passes.base import Pass, PassResult
from passctl.passes.registry import (UnknownPassError, expand_alias, expand_names, get_pass, is_alias,
                                     list_aliases, list_passes, load_plugin_file, register_pass)

__all__ = [
    "Pass", "PassResult", "UnknownPassError", "expand_alias", "expand_names", "get_pass", "is_alias",
    "list_aliases", "list_passes", "load_plugin_file", "register_pass",
]
