"""A module that fails on import, for the custom-model tests."""

raise RuntimeError("this module cannot be imported")
