"""Frontends: models from other frameworks into passctl IR (PyTorch through torch.export)."""
