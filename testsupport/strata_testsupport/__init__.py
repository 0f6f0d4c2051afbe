"""Pytest plugins shared by every component's tests: real servers started per session."""
