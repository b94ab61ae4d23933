"""The explorer's one HTML file: the page's data (:mod:`poslens.explorer.data`) and Plotly's offline
bundle, both gzip-compressed and base64-encoded inside it, and the page's own script
(``explore.js``), which unpacks them in the browser (``DecompressionStream``) and draws the views.
Nothing is loaded from the network."""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
from importlib import resources


@functools.lru_cache(maxsize=1)
def plotly_bundle() -> tuple[str, str]:
    """``(version, base64 of the gzip-compressed plotly.min.js)`` of the installed ``plotly`` package."""
    import plotly
    from plotly.offline import get_plotlyjs

    return plotly.__version__, base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode()


def _asset(name: str) -> str:
    return resources.files("poslens.explorer").joinpath(name).read_text(encoding="utf-8")


def _json_script(obj) -> str:
    """JSON safe inside a ``<script>`` element (no ``</`` can end it early)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def render_page(data: dict, blob: bytes, *, title: str) -> str:
    """The whole page as one string."""
    import jinja2

    version, plotly_b64 = plotly_bundle()
    env = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined)
    template = env.from_string(_asset("page.html.j2"))
    return template.render(title=html.escape(title), data=_json_script({**data, "plotly": version}),
                           blob=base64.b64encode(gzip.compress(blob, 6, mtime=0)).decode(), plotly=plotly_b64,
                           script=_asset("explore.js"), css=_asset("explore.css"))
