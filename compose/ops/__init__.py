"""Operator commands of the runtime: ``tokentrail topics``, ``versions`` and ``replay``."""
