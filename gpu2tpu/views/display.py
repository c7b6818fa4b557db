"""How a result reaches the screen in a notebook: the MIME bundle of text, HTML and widget."""

from __future__ import annotations

from typing import Any


def mimebundle(obj: Any, text: str, html: Any, widget: Any) -> dict[str, Any]:
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


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (which can show a live widget)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
