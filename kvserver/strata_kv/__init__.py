"""Strata KV tier server: L1 DRAM + L2 filesystem/S3 behind the Redis protocol (RESP)."""

__version__ = "0.1.0"
