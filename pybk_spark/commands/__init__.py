"""Operator and user entry points: the ``pybk`` shell and the demos."""
