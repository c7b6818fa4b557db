"""The pure engine a text goes through: `rewrite_source`, its parse, the rules' run, the check.

Text in, `Result` out, no I/O: parsing (Python's parser, then libcst), the statement-level
path, positions, the engine's state for one run, the safety net and its checks, target-torch,
and the records (`model.py`) everything else shares. It imports the analysis layer and the
rules, never `files/`, `reports/` or `notebooks/`.
"""
