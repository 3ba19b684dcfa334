"""Open an HTML file in a real headless Chromium (Debian's ``chromium``) and read back what the
page did: the size of each chart, errors, Content-Security-Policy violations, the document title,
and a screenshot. No DevTools library: the page is copied with a small probe script added
(allowed by a CSP nonce when the page keeps its own policy), and ``--dump-dom`` returns the DOM
with the probe's measurements written into an attribute."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio", "--no-default-browser-check"]  # fmt: skip
NONCE = "hermestestprobe"
_CSP = re.compile(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">')

HEAD_PROBE = f"""<script nonce="{NONCE}">window.__probe_errors=[];
addEventListener('error',function(e){{__probe_errors.push('error: '+(e.message||(e.target&&e.target.outerHTML)||'?'))}},true);
document.addEventListener('securitypolicyviolation',function(e){{__probe_errors.push('csp: '+e.violatedDirective+' '+e.blockedURI)}});
(function(){{var o=console.error;console.error=function(){{__probe_errors.push('console.error: '+Array.prototype.join.call(arguments,' '));o.apply(console,arguments)}}}})();
</script>"""
BODY_PROBE = f"""<script nonce="{NONCE}">addEventListener('load',function(){{
var charts=[].slice.call(document.querySelectorAll('svg.chart')).map(function(s){{var r=s.getBoundingClientRect();
return {{label:s.getAttribute('aria-label'),width:r.width,height:r.height,shapes:s.querySelectorAll('rect,polyline,circle,line').length}}}});
document.documentElement.setAttribute('data-probe',JSON.stringify({{charts:charts,errors:__probe_errors,title:document.title,
pwned:document.documentElement.getAttribute('data-pwned'),scripts:document.scripts.length}}))}});</script>"""


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def needs_chromium():
    return pytest.mark.skipif(chromium() is None, reason="no chromium binary (apt-get install chromium; .ci/run does it)")


def _run(args: list[str], profile: Path, timeout: int = 90) -> subprocess.CompletedProcess:
    exe = chromium()
    assert exe is not None
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def probe(page: Path, work: Path, keep_csp: bool = True) -> dict:
    """Load a copy of ``page`` with the probe and return what it measured. ``keep_csp``: the
    page's own Content-Security-Policy stays (the probe runs by its nonce); else it is removed,
    so that only escaping stands between a payload and its execution."""
    text = page.read_text(encoding="utf-8")
    m = _CSP.search(text)
    if m and keep_csp:
        text = text.replace(m.group(0), f'<meta http-equiv="Content-Security-Policy" content="{m.group(1)}; '
                                        f"script-src 'nonce-{NONCE}'\">")  # fmt: skip
    elif m:
        text = text.replace(m.group(0), "")
    text = text.replace("<head>", "<head>" + HEAD_PROBE, 1).replace("</body>", BODY_PROBE + "</body>", 1)
    copy = work / f"probe-{page.name}"
    copy.write_text(text, encoding="utf-8")
    out = _run(["--virtual-time-budget=3000", "--dump-dom", copy.resolve().as_uri()], work / "profile-probe")
    got = re.search(r'data-probe="([^"]*)"', out.stdout)
    assert got, f"the probe did not report (chromium exit {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(html.unescape(got.group(1)))


def console_errors(page: Path, work: Path) -> list[str]:
    """Chromium's own log of the unmodified page: console messages at error level and CSP refusals."""
    out = _run(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom", page.resolve().as_uri()],
               work / "profile-log")  # fmt: skip
    bad = []
    for line in out.stderr.splitlines():
        if "CONSOLE" in line and (":ERROR:" in line or "Uncaught" in line or "Refused" in line):
            bad.append(line)
        elif "Refused to" in line or "Content Security Policy" in line:
            bad.append(line)
    return bad


def screenshot(page: Path, png: Path, work: Path, size: str = "1100,1600") -> Path:
    _run([f"--window-size={size}", f"--screenshot={png}", page.resolve().as_uri()], work / "profile-shot")
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "no screenshot written"
    return png
