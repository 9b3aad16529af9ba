"""Op definition (schema, fake, autograd, every backend: :mod:`qkernels.ops._library`) and the
functional API, one module per hot path."""
