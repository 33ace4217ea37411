"""Pass-test setup: verify-each always on, and the pass/rule registries restored after each test."""

from __future__ import annotations

import pytest

from passctl.passes import registry
from passctl.passes.manager import PassManager
from passctl.passes.rewrite import ruleset


@pytest.fixture(autouse=True)
def _verify_each_always():
    """Every PassManager in these tests verifies the IR on input and after every pass."""
    old = PassManager.default_verify_each
    PassManager.default_verify_each = True
    yield
    PassManager.default_verify_each = old


@pytest.fixture(autouse=True)
def _restore_registries():
    """Dummy passes and rules registered by a test do not leak into the next one."""
    registry._ensure_loaded()
    passes, rules, aliases = dict(registry._PASSES), dict(ruleset._RULES), dict(ruleset._ALIASES)
    yield
    registry._PASSES.clear()
    registry._PASSES.update(passes)
    ruleset._RULES.clear()
    ruleset._RULES.update(rules)
    ruleset._ALIASES.clear()
    ruleset._ALIASES.update(aliases)
