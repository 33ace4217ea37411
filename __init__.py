"""passctl: a compiler framework for trained neural networks (graph IR, passes, target emitters)."""

__version__ = "0.1.0"


def __getattr__(name):
    # passctl.Generator: imported on first use (onnxruntime and numpy load only then)
    if name == "Generator":
        from passctl.targets.onnxruntime.generate import Generator

        return Generator
    raise AttributeError(f"module 'passctl' has no attribute '{name}'")
