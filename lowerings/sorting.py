"""Lowerings: sorting ops."""
