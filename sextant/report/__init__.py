"""The self-contained report: no scripts, fonts or requests from outside the file.

`build_report` gathers everything the page shows into one JSON-able dict; `render` turns it
into HTML, Markdown or JSON; `write_report` writes one compare group's report atomically.
"""

from sextant.report.html import FORMATS, load_advice, render, render_html, write_report
from sextant.report.model import build_report

__all__ = ["FORMATS", "build_report", "load_advice", "render", "render_html", "write_report"]
