"""Notebooks: each code cell through `rewrite_source`, IPython syntax masked and put back,
the JSON edited as text, and the notebook-only checks (G2T510-512).

Pure like `core/`, which it builds on; it never imports `files/` or `reports/`.
"""
