"""The analysis layer every rule asks: what the code means, and how to edit it.

- `names`: what a dotted name refers to through the module's imports;
- `literals`: string literals and small expression shapes;
- `edits`: arguments, parentheses, statements and imports, as fixes build them;
- `placement`: where new statements (the device line, imports) go;
- `flow`: loops, training loops, rank-only branches and what values are tensors;
- `defaults`: which names a default feeds, and where a count scales a size.

Rule modules (`gpu2tpu/rewrite/rules/`) import this layer and the rule base only, never each
other, so a fact is computed once and means the same to every family.
"""
