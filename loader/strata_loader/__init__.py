"""Strata."""
