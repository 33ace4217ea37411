"""Repository layout rules that keep the test suite importable in one pytest process."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_modules_have_unique_basenames():
    # pytest's default (prepend) import mode puts each test folder on sys.path, so two modules named
    # helpers.py or test_corpus.py in different folders shadow each other in one xdist worker.
    names = Counter(p.name for p in TESTS.rglob("*.py")
                    if p.name not in ("conftest.py", "__init__.py") and ".cache" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
