"""Serve a directory on 127.0.0.1 from a thread, for the widget browser test.

Chromium may refuse `file://` pages that load scripts with crossorigin, and the test must
not reach any CDN, so the exported widget page and the vendored HTML manager (`embed.js`
and the font files next to it) are served locally on a free port.

Run by hand to look at a page: `python tests/browser/serve.py DIR` (Ctrl-C stops it).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Site:
    """Where the directory is served, and every request answered: (path, HTTP status)."""

    url: str
    requests: list[tuple[str, int]] = field(default_factory=list)


class RecordingHandler(SimpleHTTPRequestHandler):
    """A static file handler that records requests instead of printing them."""

    site: Site

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = int(code) if str(code).isdigit() else 0
        self.site.requests.append((self.path, status))

    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        return None


@contextmanager
def serve(directory: str | Path) -> Iterator[Site]:
    """Serve `directory` at http://127.0.0.1:<free port>/ until the block ends."""
    site = Site(url="")
    handler_class = type("Handler", (RecordingHandler,), {"site": site})
    handler = functools.partial(handler_class, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    site.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, name="widget-test-server", daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    with serve(root) as served:
        print(f"serving {root.resolve()} at {served.url} (Ctrl-C to stop)")
        with suppress(KeyboardInterrupt):
            threading.Event().wait()
