"""Kernel emitters: each turns IR nodes into a ``KernelCode``."""
