"""Lowerings: fft ops."""
