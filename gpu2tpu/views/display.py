"""How a result reaches the screen: the MIME bundle of text, HTML and widget, and whether
this runs in a Jupyter kernel at all (the one place that asks)."""

from __future__ import annotations

import sys
from typing import Any

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def in_kernel(shell: Any = None) -> bool:
    """Whether this runs in a Jupyter kernel, which can show a live widget: `shell`'s, or
    the running IPython's. Without IPython imported there is no kernel, and this does not
    import it."""
    if shell is None:
        if "IPython" not in sys.modules:
            return False
        from IPython import get_ipython

        shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def mimebundle(text: str, html: Any, widget: Any) -> dict[str, Any]:
    """text/plain + static text/html always; the live widget too when a kernel can show it.

    Frontends without the widget manager (nbconvert, GitHub, a bare console) fall back to
    the HTML or the text, as tqdm learnt to (docs/profiler.md, "Views").
    """
    bundle: dict[str, Any] = {"text/plain": text, "text/html": html()}
    if in_kernel():
        try:
            view = widget()
            bundle.update(view._repr_mimebundle_() or {})
            bundle["text/plain"] = text
        except Exception:  # no widget support here: the HTML fallback is already in the bundle
            pass
    return bundle


def display_with_fallbacks(widget: Any, html: str, text: str) -> None:
    """Display a widget together with an HTML and a text version of the same content.

    A live front end shows the widget; a saved notebook opened without the kernel's widget
    state (GitHub, VS Code's viewer, nbconvert) shows the HTML table, a terminal the text,
    instead of a widget's repr. `widget` is the widget or a function that builds it; when
    it cannot be built here (no ipywidgets), the HTML and the text are displayed alone.
    """
    from IPython.display import display

    bundle: dict[str, Any] = {"text/html": html, "text/plain": text}
    try:
        view = widget() if callable(widget) else widget
        data = view._repr_mimebundle_() or {}
    except Exception:  # no widget support here: the fallbacks are already in the bundle
        data = {}
    if WIDGET_MIME in data:
        bundle[WIDGET_MIME] = data[WIDGET_MIME]
    display(bundle, raw=True)


def show(report: Any, shell: Any) -> None:
    """A report with `widget()`, `_repr_html_()` and `__str__`, as a magic shows it: the
    widget with its fallbacks in a notebook kernel, the text in a terminal."""
    if in_kernel(shell):
        display_with_fallbacks(report.widget, report._repr_html_(), str(report))
    else:
        print(report)
