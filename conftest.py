"""Loads the graders' pytest plugin for every run from this repository (kata folders and tests/)."""
pytest_plugins = ["graders.pytest_plugin"]
