"""Imports every rule module, so the registry is complete."""

from tilewright.kinds.loop.lower import indexing, pointwise, quantize, quantize_mx, reductions, scans, scatters, views  # noqa: F401
