"""Drop-in replacements for other libraries' quantizers, running on qkernels' ops.

- :mod:`qkernels.compat.vector_quantize_pytorch`: ``FSQ`` and ``LatentQuantize`` with the interface of
  `vector-quantize-pytorch <https://github.com/lucidrains/vector-quantize-pytorch>`_ 1.32.0: change
  ``from vector_quantize_pytorch import FSQ, LatentQuantize`` to
  ``from qkernels.compat.vector_quantize_pytorch import FSQ, LatentQuantize``.
"""
