"""The self-contained HTML report: no scripts, fonts or requests from outside the file."""

from sextant.report.html import render_html, write_report

__all__ = ["render_html", "write_report"]
