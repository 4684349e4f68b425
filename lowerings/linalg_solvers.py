"""Lowerings: linalg_solvers ops."""
