"""Old name of :mod:`passctl.support.check` (running ONNX Runtime, comparing outputs), which moved
to the neutral layer below passes and emitters; this module keeps ``passctl.tools.check`` imports
working. New code imports :mod:`passctl.support.check`."""

from passctl.support.check import *  # noqa: F401,F403
from passctl.support.check import __all__, cpu_session  # noqa: F401
