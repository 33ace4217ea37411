"""passctl: a compiler framework for trained neural networks (graph IR, passes, target emitters)."""

__version__ = "0.1.0"
