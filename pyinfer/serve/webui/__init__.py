"""The chat page `pyinfer serve` answers at / (static files in the package: no build step, no CDN).

Files are read once, when the app is made; only the names below are served, so no request path reaches the file
system. The Content-Security-Policy lets the page load only its own scripts and styles and talk only to this
server, a second fence behind the renderer's (model text reaches the page as text, never as HTML)."""
from __future__ import annotations

from importlib import resources

FILES = {"index.html": "text/html; charset=utf-8", "chat.js": "text/javascript; charset=utf-8",
         "markdown.js": "text/javascript; charset=utf-8", "chat.css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new pyinfer's page is seen at once after an upgrade
}


def load_files() -> dict[str, tuple[bytes, str]]:
    """{name: (bytes, media type)} of the page's files."""
    root = resources.files(__name__)
    return {name: ((root / name).read_bytes(), kind) for name, kind in FILES.items()}
