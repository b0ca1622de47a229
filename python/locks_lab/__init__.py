"""The LOCKS lab: studies, task generators, captures and the `python -m locks_lab` CLI
(generate / capture) built on the library package `locks`. Not part of the library API:
shipped in the same wheel for convenience (docs/python.md, "Library and lab").
"""
