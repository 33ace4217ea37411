"""Attention fusion: export patterns -> passctl::Attention (guarded), lowered per target."""
