"""The edge that touches files and processes: which files, read, write back, worker pools.

Discovery (excludes, .gitignore), the configuration read from each project, atomic writes,
the worker processes and Ctrl-C. It sends each text through `core/` (and a notebook through
`notebooks/`) and hands a `RunReport` to `reports/`, which it never imports.
"""
