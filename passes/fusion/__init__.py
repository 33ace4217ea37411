"""Fusion passes: operator patterns folded or merged into fewer, cheaper nodes (fuse-conv-bn, ...)."""
