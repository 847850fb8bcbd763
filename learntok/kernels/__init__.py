"""Compiled kernels with plain reference implementations."""
