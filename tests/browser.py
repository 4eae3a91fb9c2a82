"""Real-browser test kit: a Jupyter server and headless Chromium, as pytest fixtures and helpers.

Import the fixtures into a test module (or a conftest) to use them::

    from browser import chromium, jupyter_server, lab_page  # noqa: F401  (pytest fixtures)

* ``jupyter_server`` (session): JupyterLab on 127.0.0.1 at a free port with a random token,
  ``allow_root``, a temporary root folder, isolated config/data/runtime/settings folders, the
  app exposed as ``window.jupyterapp``, and a kernel spec ``memflow-venv`` that runs this
  interpreter (so the notebook's kernel sees this venv's memflow).
* ``chromium`` (module): a Playwright browser context on Debian's ``/usr/bin/chromium``
  (never a downloaded browser), headless, no sandbox, no network chatter, a fresh profile.
  Tests using it are skipped, saying why, when that binary is absent.
* ``lab_page``: a new page in that context, closed after the test.

Helpers: :func:`write_notebook`, :func:`open_notebook`, :func:`run_all_cells`,
:func:`canvas_ink` (colourful pixels drawn in the canvases under a CSS selector, shadow roots
included), :func:`wait_for_ink`, :func:`screenshot` (under ``artifacts/``, which git ignores)
and :func:`explained` (a failure comes with a screenshot, the page's errors and the server
log).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
KERNEL = "memflow-venv"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]
# JupyterLab settings that keep a test page quiet and whole: no news or update pop-ups, and
# every cell rendered (no windowing), so outputs below the fold exist for clicks and pictures.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


@dataclass
class JupyterServer:
    """A running Jupyter server: where it listens and where its files are."""

    url: str
    token: str
    root: Path
    log: Path
    proc: subprocess.Popen

    def lab_url(self, notebook: str) -> str:
        """The JupyterLab URL that opens ``notebook`` (relative to :attr:`root`)."""
        return f"{self.url}/lab/tree/{notebook}?token={self.token}"

    def voila_url(self, notebook: str) -> str:
        """The URL where Voila (a server extension of the same server) renders ``notebook``."""
        return f"{self.url}/voila/render/{notebook}?token={self.token}"

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log (for failure messages)."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the Jupyter server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the Jupyter server did not answer {url} within {timeout} s")


def start_jupyter(base: Path, *, app: str = "lab", timeout: float = 60.0) -> JupyterServer:
    """Start ``jupyter <app>`` (``lab`` or ``server``) with its folders under ``base``."""
    root = base / "root"
    root.mkdir(parents=True)
    data = base / "data"
    _write_json(data / "kernels" / KERNEL / "kernel.json", {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (memflow venv)", "language": "python"})
    settings = base / "settings"
    for name, doc in LAB_SETTINGS.items():
        _write_json(settings / name, doc)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(base / "config"), JUPYTER_PATH=str(data),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"), IPYTHONDIR=str(base / "ipython"),
               PYTHONUNBUFFERED="1")
    port, token = free_port(), secrets.token_hex(16)
    log = base / "server.log"
    cmd = [sys.executable, "-m", "jupyter", app, "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", "--ServerApp.allow_root=True",
           f"--ServerApp.root_dir={root}"]
    if app == "lab":
        cmd += ["--LabApp.expose_app_in_browser=True",
                f"--LabApp.user_settings_dir={settings}",
                f"--LabApp.workspaces_dir={base / 'workspaces'}"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=root)
    server = JupyterServer(f"http://127.0.0.1:{port}", token, root, log, proc)
    try:
        _wait_http(f"{server.url}/api/status?token={token}", proc, timeout)
    except Exception as exc:
        stop_jupyter(server)
        raise RuntimeError(f"{exc}\n--- server log ---\n{server.log_tail()}") from None
    return server


def stop_jupyter(server: JupyterServer) -> None:
    """Shut the server (and its kernels) down; kill it if it does not go within 15 s."""
    if server.proc.poll() is None:
        try:
            req = urllib.request.Request(f"{server.url}/api/shutdown?token={server.token}",
                                         method="POST")
            urllib.request.urlopen(req, timeout=5).close()
        except OSError:
            server.proc.terminate()
        try:
            server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=5)


@pytest.fixture(scope="session")
def jupyter_server() -> Iterator[JupyterServer]:
    """JupyterLab on 127.0.0.1 for the whole session (see the module docstring)."""
    base = Path(tempfile.mkdtemp(prefix="memflow-jupyter-"))
    server = start_jupyter(base)
    try:
        yield server
    finally:
        stop_jupyter(server)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium context (Debian's binary, a fresh profile) for the test module.

    Module-scoped, not session-scoped: Playwright's sync API keeps an asyncio loop running in
    this thread while it is open, and ``asyncio.run`` in any later test would then fail.
    """
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium package "
                    "(scripts/setup does) to run the real-browser tests")
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="memflow-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000})
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def lab_page(chromium):
    """A fresh page of the session's browser, closed after the test."""
    page = chromium.new_page()
    page.set_default_timeout(60_000)
    try:
        yield page
    finally:
        page.close()


def write_notebook(path: Path, cells: list[str]) -> Path:
    """Write a notebook of code ``cells`` that runs on the ``memflow-venv`` kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python (memflow venv)",
                                 "language": "python"}
    nbformat.write(nb, str(path))
    return path


def open_notebook(page, server: JupyterServer, notebook: str) -> None:
    """Open ``notebook`` in JupyterLab and wait until its kernel is ready."""
    page.goto(server.lab_url(notebook))
    page.wait_for_function(
        """() => {
            const app = window.jupyterapp;
            const w = app && app.shell.currentWidget;
            const k = w && w.sessionContext && w.sessionContext.session
                      && w.sessionContext.session.kernel;
            return k && k.connectionStatus === 'connected' && k.status === 'idle';
        }""", timeout=90_000)


def run_all_cells(page) -> None:
    """Run every cell of the open notebook (as Run ▸ Run All Cells would)."""
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


_CANVAS_INK_JS = """(selector) => {
    const canvases = [];
    const walk = (node) => {
        if (!node) return;
        if (node.tagName === 'CANVAS') canvases.push(node);
        if (node.shadowRoot) walk(node.shadowRoot);
        for (const child of node.children || []) walk(child);
    };
    document.querySelectorAll(selector).forEach(walk);
    let ink = 0;
    for (const c of canvases) {
        if (!c.width || !c.height) continue;
        const ctx = c.getContext('2d');
        if (!ctx) continue;
        const px = ctx.getImageData(0, 0, c.width, c.height).data;
        for (let i = 0; i < px.length; i += 4) {
            const [r, g, b, a] = [px[i], px[i + 1], px[i + 2], px[i + 3]];
            if (a > 100 && Math.max(r, g, b) - Math.min(r, g, b) > 60) ink++;
        }
    }
    return {canvases: canvases.length, ink: ink};
}"""


def canvas_ink(page, selector: str) -> dict:
    """``{"canvases": n, "ink": pixels}``: colourful (not grey) pixels drawn in the canvases
    under ``selector``, shadow roots included — axes and text are grey, data is coloured."""
    return page.evaluate(_CANVAS_INK_JS, selector)


def wait_for_ink(page, selector: str, minimum: int, timeout: float = 60_000) -> dict:
    """Wait until the canvases under ``selector`` hold at least ``minimum`` colourful pixels
    (charts paint a few animation frames after their data arrives); return :func:`canvas_ink`."""
    page.wait_for_function(f"(a) => ({_CANVAS_INK_JS})(a.selector).ink >= a.minimum",
                           arg={"selector": selector, "minimum": minimum}, timeout=timeout)
    return canvas_ink(page, selector)


@contextmanager
def explained(page, server: JupyterServer | None, name: str) -> Iterator[None]:
    """On failure inside the block, save ``artifacts/<name>-failed.png`` and add the page's
    last console errors and the server log's tail to the error (a browser test that fails in
    CI must say what the page looked like)."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text[:300]) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)[:300]))
    try:
        yield
    except Exception as exc:
        shot = screenshot(page, f"{name}-failed")
        log = server.log_tail() if server is not None else ""
        raise AssertionError(f"{exc}\n--- screenshot: {shot}\n--- page errors:\n"
                             + "\n".join(errors[-10:]) + f"\n--- server log:\n{log}") from exc


def screenshot(page, name: str) -> Path:
    """Save a full-page screenshot as ``artifacts/<name>.png`` and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
