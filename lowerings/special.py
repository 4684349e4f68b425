"""Lowerings: special ops."""
