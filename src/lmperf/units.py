"""Byte units, defined once: a GiB and a MiB are powers of 1024 (torchtitan's convention)."""

GIB = 2**30
MIB = 2**20
