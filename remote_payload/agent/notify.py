"""Webhook notifications from the container: a JSON POST per job event to each ``notify`` URL.

Sent from the container side (the job's wrapper, or the agent for a job it finds LOST), so
they arrive while no opsctl client is connected. The standard library's ``urllib.request``
does the POST: the payload runs on the container's python with no extra packages, and a
webhook needs nothing more. Delivery never blocks or fails the job: the wrapper sends from
a background thread (:class:`Notifier`), each POST has a short timeout and a few retries,
and every outcome is one line in the job's ``notify.log``.

Events (``event`` in the body): ``healthy``, ``failed``, ``finished`` (SUCCEEDED or
CANCELLED), ``lost``, ``restart``, ``hang``. Body (docs/contracts.md)::

    {"event": "failed", "job": id, "name": str, "host": str|null, "ct": int|null,
     "state": "FAILED", "diagnosis": str|null, "last_step": int|null, "attempt": int,
     "max_restarts": int|null, "exit_code": int|null, "signal": str|null,
     "end_reason": str|null, "at": float}

A LOST job's wrapper is gone, so the next agent verb that reconciles it sends ``lost`` once
(``notify_lost``, marker ``notify.lost``) from a detached process, so that ``status`` never waits
on a webhook.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
import typing as t
import urllib.error
import urllib.request

from remote_payload import wire

LOG = "notify.log"
LOST_MARKER = "notify.lost"  # the agent sent (or is sending) the LOST notification
TIMEOUT_S = 5.0
TRIES = 3
RETRY_PAUSE_S = 1.0  # doubled after each failed try
DRAIN_S = 15.0  # how long a wrapper that ends waits for its notifications to go out
USER_AGENT = "opsctl-agent"

EVENT_HEALTHY = "healthy"
EVENT_FAILED = "failed"
EVENT_FINISHED = "finished"
EVENT_LOST = "lost"
EVENT_RESTART = "restart"
EVENT_HANG = "hang"


valid_url = wire.valid_notify_url


def _log(job_dir: str, line: str) -> None:
    with contextlib.suppress(OSError), open(os.path.join(job_dir, LOG), "a", encoding="utf-8") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def post(url: str, body: dict[str, t.Any], job_dir: str, *, tries: int = TRIES,
         timeout: float = TIMEOUT_S, pause: float = RETRY_PAUSE_S) -> bool:
    """POST ``body`` as JSON; True when a 2xx came back. Every outcome goes to ``notify.log``."""
    data = json.dumps(body, separators=(",", ":")).encode()
    for n in range(1, tries + 1):
        req = urllib.request.Request(url, data=data, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": USER_AGENT})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # valid_url: http(s) only
                code = resp.status
            if 200 <= code < 300:
                _log(job_dir, f"sent {body.get('event')} to {url}: HTTP {code}")
                return True
            why = f"HTTP {code}"
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
        except Exception as exc:  # URLError, timeout, connection reset...: logged, never raised
            why = f"{type(exc).__name__}: {exc}"
        _log(job_dir, f"try {n}/{tries}: {body.get('event')} to {url} failed: {why}")
        if n < tries:
            time.sleep(pause * 2 ** (n - 1))
    _log(job_dir, f"gave up on {body.get('event')} to {url} after {tries} tries")
    return False


def body(event: str, *, spec: t.Mapping[str, t.Any], status: t.Mapping[str, t.Any],
         diagnosis: str | None = None) -> dict[str, t.Any]:
    """The notification document for ``event`` from the job's spec and status record."""
    target = spec.get("target") or {}
    step = (status.get("last_step") or {}).get("step")
    return {
        "event": event, "job": spec.get("job_id"), "name": spec.get("name"),
        "host": target.get("host"), "ct": target.get("ct"), "state": status.get("state"),
        "diagnosis": diagnosis, "last_step": step, "attempt": status.get("attempt") or 1,
        "max_restarts": (spec.get("restart") or {}).get("max_restarts"),
        "exit_code": status.get("exit_code"), "signal": status.get("signal"),
        "end_reason": status.get("end_reason"), "at": time.time(),
    }


class Notifier:
    """The wrapper's sender: one background thread posts queued notifications in order."""

    def __init__(self, urls: t.Sequence[str], job_dir: str):
        self.urls = [u for u in urls if valid_url(u)]
        self.job_dir = job_dir
        self.queue: queue.Queue[dict[str, t.Any] | None] = queue.Queue()
        self.thread: threading.Thread | None = None

    def send(self, doc: dict[str, t.Any]) -> None:
        """Queue ``doc`` for every URL; returns at once."""
        if not self.urls:
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="notify", daemon=True)
            self.thread.start()
        self.queue.put(doc)

    def _run(self) -> None:
        while True:
            doc = self.queue.get()
            try:
                if doc is None:
                    return
                for url in self.urls:
                    post(url, doc, self.job_dir)
            except Exception as exc:  # a notifier bug must never take the wrapper down
                _log(self.job_dir, f"notifier error: {type(exc).__name__}: {exc}")
            finally:
                self.queue.task_done()

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait (bounded) for queued notifications before the wrapper exits."""
        if self.thread is None:
            return
        self.queue.put(None)
        self.thread.join(timeout)


def notify_lost(job_dir: str, urls: t.Sequence[str], doc: dict[str, t.Any]) -> bool:
    """Send ``lost`` once for a job whose wrapper is gone, from a detached process.

    The marker is created exclusively, so two agents reconciling at once send it once.
    Returns whether this call started the sender.
    """
    urls = [u for u in urls if valid_url(u)]
    if not urls:
        return False
    try:
        fd = os.open(os.path.join(job_dir, LOST_MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    os.close(fd)
    import subprocess

    payload = json.dumps({"urls": urls, "body": doc}).encode()
    payload_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": payload_dir}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "remote_payload.agent.notify", job_dir],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        if proc.stdin is None:  # unreachable: stdin=PIPE
            raise OSError("the sender has no stdin pipe")
        proc.stdin.write(payload)
        proc.stdin.close()
    except OSError as exc:
        _log(job_dir, f"could not start the lost notification sender: {exc}")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python3 -m remote_payload.agent.notify JOB_DIR`` with ``{"urls", "body"}`` on stdin."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python3 -m remote_payload.agent.notify JOB_DIR < request.json\n")
        return 2
    try:
        req = json.loads(sys.stdin.buffer.read() or b"{}")
    except ValueError:
        return 2
    for url in req.get("urls") or []:
        if valid_url(url):
            post(url, req.get("body") or {}, args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
