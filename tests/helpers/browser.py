"""A real browser for the tests: headless Chromium driven over the Chrome DevTools Protocol, one tab at a time.

Screenshots go to $TORCHLAB_ARTIFACTS (default .cache/test-artifacts/), kept after the tests.
"""

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import websocket

from helpers.docker import wait_for

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TORCHLAB_ARTIFACTS", ROOT / ".cache" / "test-artifacts"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-proxy-server",
    "--remote-debugging-port=0",
    "--window-size=1400,2400",
]


class DevToolsPage:
    """One browser tab over the Chrome DevTools Protocol: commands and their answers on the tab's websocket."""

    def __init__(self, websocket_url):
        self.connection = websocket.create_connection(websocket_url, timeout=60, suppress_origin=True)
        self.last_id = 0

    def call(self, method, **params):
        self.last_id += 1
        self.connection.send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:  # events (none are enabled) and nothing else may come before the answer
            message = json.loads(self.connection.recv())
            if message.get("id") == self.last_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector, text, timeout=30):
        """Move to, press and release the mouse on the first `selector` element whose text is `text`."""
        centre_of_element = f"""(() => {{
            const element = [...document.querySelectorAll({json.dumps(selector)})]
                .find(e => e.textContent.trim() === {json.dumps(text)});
            const box = element && element.getBoundingClientRect();
            return box && box.width > 0 ? {{x: box.x + box.width / 2, y: box.y + box.height / 2}} : null;
        }})()"""
        centre = wait_for(lambda: self.evaluate(centre_of_element), timeout, f"{text!r} ({selector}) on the page")
        for event in ("mouseMoved", "mousePressed", "mouseReleased"):
            click = {} if event == "mouseMoved" else {"clickCount": 1}
            self.call("Input.dispatchMouseEvent", type=event, x=centre["x"], y=centre["y"], button="left", **click)

    def menu_command(self, menu, item, timeout=60):
        """Click `item` of the menu bar's `menu`. The menu is clicked again while none has opened: on a busy
        machine the menu bar shows, and may still move, before a click on it opens anything."""
        deadline = time.monotonic() + timeout
        while True:
            self.click(".lm-MenuBar-itemLabel", menu)
            try:
                return self.click(".lm-Menu-itemLabel", item, timeout=5)
            except AssertionError:
                if time.monotonic() > deadline or self.evaluate("document.querySelector('.lm-Menu') !== null"):
                    raise

    def screenshot(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self):
        self.connection.close()


@contextlib.contextmanager
def headless_chromium(tmp_path):
    """A headless Chromium with a fresh profile; yields its one tab. Skips where Chromium is not installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed on this host (Debian: apt-get install -y chromium)")
    profile = tmp_path / "profile"
    log = (tmp_path / "chromium.log").open("w")
    process = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    page = None
    try:
        port_file = profile / "DevToolsActivePort"

        def devtools_port():
            if process.poll() is not None:
                raise AssertionError(
                    f"chromium exited ({process.returncode}):\n{(tmp_path / 'chromium.log').read_text()}"
                )
            return port_file.exists() and port_file.read_text().split("\n", 1)[0].strip()

        port = wait_for(devtools_port, 60, "chromium's DevTools port")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            targets = json.loads(response.read())
        page = DevToolsPage(next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"))
        yield page
    finally:
        if page is not None:
            page.close()
        os.killpg(process.pid, signal.SIGTERM)  # its own process group: the browser and its helpers
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)
        log.close()
