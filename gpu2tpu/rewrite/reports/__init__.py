"""How a run looks: text, JSON, CSV, GitHub annotations, SARIF, Markdown, and the rule docs.

Renderings of a `RunReport` (files/engine.py) and of the rule classes; they decide nothing
about the code.
"""
