"""Pure-PyTorch reference implementations: the specification and fallback of every op.

Each function has the signature of the backend implementations it specifies (already-validated,
already-reshaped inputs); the public, validating API is in :mod:`qkernels.ops`.
"""
