"""Helpers shared by the tests (model builders, paths, goldens); not tests themselves."""
