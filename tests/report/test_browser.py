"""Open the report in headless Chromium: no console message, no network request, a screenshot.

Chromium is driven through its command line (no Python dependency). Console messages are
read from its log on stderr ("CONSOLE" lines). Requests are read from its NetLog
(--log-net-log): a request started by the page carries the page's file:// origin in its
network isolation key or a page initiator, while Chromium's own background traffic (update
checks, account lookups) has the initiator "not an origin"; every request that is not
clearly the browser's own counts as the page's. A control page that does load a remote
image and log to the console proves that both checks see what they must see.

Locally the test is skipped when Chromium is missing; with CI set it fails instead
(.ci/install-system installs Debian's chromium). SEXTANT_CHROMIUM=/path/to/chrome picks
another binary.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sextant.report import render_html
from tests.report.runs import calibrated_machine, compare_group

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
BROWSER_INTERNAL = "not an origin"


def find_chromium() -> str | None:
    """SEXTANT_CHROMIUM if set (another Chromium or Chrome binary), else Debian's chromium."""
    override = os.environ.get("SEXTANT_CHROMIUM")
    if override:
        return override if os.access(override, os.X_OK) else None
    for name in CANDIDATES:
        path = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        reason = ("chromium is not installed (looked for $SEXTANT_CHROMIUM, /usr/bin/chromium, "
                  "chromium, chromium-browser); install it with .ci/install-system")
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    return path


def _load_netlog(path: Path) -> dict[str, Any]:
    text = path.read_text(errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # A log cut short (browser killed) lacks its closing brackets.
        return json.loads(text.rstrip().rstrip(",") + "]}")


def page_requests(netlog: dict[str, Any]) -> list[str]:
    """URLs of every URL request in the NetLog that the browser did not start on its own."""
    types = {v: k for k, v in netlog["constants"]["logEventTypes"].items()}
    request = netlog["constants"]["logSourceType"]["URL_REQUEST"]
    events = [ev for ev in netlog.get("events", [])
              if (ev.get("source") or {}).get("type") == request]
    internal = set()
    for ev in events:
        params = ev.get("params") or {}
        if (types.get(ev.get("type")) == "URL_REQUEST_START_JOB"
                and params.get("initiator") == BROWSER_INTERNAL
                and "file://" not in str(params.get("network_isolation_key", ""))):
            internal.add(ev["source"]["id"])
    urls = []
    for ev in events:
        url = str((ev.get("params") or {}).get("url") or "")
        if url and ev["source"]["id"] not in internal and url not in urls:
            urls.append(url)
    return urls


def open_page(chromium: str, page: Path, workdir: Path, *, size: str = "1280,2400"
              ) -> tuple[list[str], list[str], Path]:
    """Load `page`; return (console lines, page request URLs, screenshot path)."""
    shot = workdir / f"{page.stem}.png"
    netlog = workdir / f"{page.stem}.netlog.json"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-extensions", "--hide-scrollbars",
         f"--user-data-dir={workdir / 'profile'}", "--enable-logging=stderr", "--v=0",
         f"--log-net-log={netlog}", f"--screenshot={shot}", f"--window-size={size}",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert shot.is_file() and netlog.is_file(), proc.stderr[-3000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return console, page_requests(_load_netlog(netlog)), shot


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_control_page_is_caught(chromium: str, tmp_path: Path) -> None:
    """The checks work: a page that fetches and logs is flagged (port 9 is closed)."""
    bad = tmp_path / "control.html"
    bad.write_text('<!doctype html><html><body><img src="http://127.0.0.1:9/x.png">'
                   '<script>console.error("control-error")</script></body></html>')
    console, requests, _ = open_page(chromium, bad, tmp_path, size="400,300")
    assert any("control-error" in line for line in console), console
    assert "http://127.0.0.1:9/x.png" in requests, requests


def test_report_opens_offline_without_errors(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(compare_group(), machine=calibrated_machine(tmp_path)),
                    encoding="utf-8")
    console, requests, shot = open_page(chromium, page, tmp_path)
    assert console == [], console
    assert requests == [], requests
    assert png_size(shot) == (1280, 2400)
    assert shot.stat().st_size > 50_000  # a rendered page, not a blank one
    keep = os.environ.get("SEXTANT_SCREENSHOT_DIR")
    if keep:  # CI can keep the picture as an artifact
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "report.png")
