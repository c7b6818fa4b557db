"""Views: how results look in a terminal (text, rich), in static HTML and as notebook widgets.

Results import these lazily, inside their `__repr__`, `__rich__` and `_repr_*` methods; the
views import the results' modules only for types, so a view never decides anything."""
