"""The ``passctl::`` dialect: schemas of the canonical ops that fusions emit, lowerings consume and
emitters convert (``canonical``: LayerNorm, RMSNorm, Gelu, ...; ``attention``: Attention; ``rotary``: RotaryEmbedding).

A leaf below passes and targets: it imports only :mod:`passctl.ir`.
"""
