"""The compare / bisect / diff tests use the in-process ``cli`` runner of tests/conftest.py."""
