"""Operator tests (a package so pytest never names a module after the `operator` folder)."""
