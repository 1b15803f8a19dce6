"""Seeing the run: memory sampling (and, later, phase timing and the gradient noise scale)."""
