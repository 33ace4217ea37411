"""Decoder-only language models as ONNX graphs with an explicit, static KV cache.

* :mod:`.spec` -- :class:`DecoderSpec`, the architecture read from a transformers config
  (Llama, Mistral, Qwen2, SmolLM2 families), refusing what the graph cannot express.
* :mod:`.graph` -- :func:`build_decoder`: one ONNX graph, used for prefill and for every decode
  step, lowered to ONNX Runtime's ``com.microsoft`` contrib ops (GroupQueryAttention with the past
  and present cache sharing one preallocated buffer, SimplifiedLayerNormalization, fused Q/K/V
  and gate/up projections).
* :mod:`.layout` -- :func:`detect_layout`: which decoder layout an existing ONNX model has
  (passctl's static cache, or the ``past_key_values.N.key`` / ``present.N.key`` layout of
  Optimum and onnxruntime-genai), refusing others with one line.

See docs/generate.md.
"""
