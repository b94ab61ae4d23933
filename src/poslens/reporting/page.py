"""What every poslens HTML page shares: its content security policy and the jinja2 environment of the
templates beside this module (the report's and the fingerprint's)."""

from __future__ import annotations

from pathlib import Path

#: a page loads nothing: images are embedded as data URLs, styles inline, no script
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'none'; base-uri 'none'; form-action 'none'"


def template_env():
    """The jinja2 environment of the page templates: autoescaped, undefined names are errors."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
                              autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
                              trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
