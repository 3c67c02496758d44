"""A real `redis-server` for tests, examples and benchmarks: `RedisServer`.

`RedisServer(*, maxmemory=None, policy="allkeys-lru", executable="redis-server")`
starts nothing until `start()` (or ``with RedisServer() as server:``): then a
``redis-server`` process listens on a free port of 127.0.0.1, with its own temporary
directory, no persistence (``--save '' --appendonly no``) and, with `maxmemory` (bytes),
server-side eviction by `policy`. `url` is ``redis://127.0.0.1:PORT/0``.

- `kill()` — SIGKILL, as a crash would (the data is gone: nothing persists);
- `restart()` — start again on the same port (after `kill()` or `stop()`);
- `stop()` — SIGTERM, wait, SIGKILL if it lingers; remove the temporary directory
  (also on leaving the ``with`` block). `running` says whether the process is alive.

`available()` says whether the executable is on PATH; `RedisServerError` is raised when
it is not, or when the server does not answer PING within `startup_timeout` seconds
(the message carries the end of the server's log).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = ["RedisServer", "RedisServerError", "available"]


class RedisServerError(UnicacheFsmError, RuntimeError):
    """The test server could not be started (not installed, or it never answered)."""


def available(executable: str = "redis-server") -> bool:
    return shutil.which(executable) is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process on loopback; see the module docstring."""

    def __init__(
        self,
        *,
        maxmemory: int | None = None,
        policy: str = "allkeys-lru",
        executable: str = "redis-server",
        startup_timeout: float = 10.0,
    ) -> None:
        self.maxmemory = maxmemory
        self.policy = policy
        self.executable = executable
        self.startup_timeout = startup_timeout
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, running={self.running})"

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start on a free port (a few tries: another process may take the port first)."""
        exe = shutil.which(self.executable)
        if exe is None:
            msg = (
                f"{self.executable} is not installed; install it (Debian: apt-get install -y "
                "redis-server) to run the Redis store against a real server"
            )
            raise RedisServerError(msg)
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="unicache-redis-"))
        last = ""
        for _ in range(5):
            self.port = _free_port()
            if self._spawn(exe):
                return
            last = self._log_tail()
        msg = f"redis-server did not start on a free loopback port; its log ends: {last}"
        raise RedisServerError(msg)

    def restart(self) -> None:
        """Start again on the same port (the server holds no pages: nothing persisted)."""
        exe = shutil.which(self.executable)
        assert exe is not None and self.port, "restart() follows start()"
        if self.running:
            self.kill()
        deadline = time.monotonic() + self.startup_timeout
        while not self._spawn(exe):  # the port may linger a moment after a kill
            if time.monotonic() > deadline:
                msg = f"redis-server did not restart on port {self.port}: {self._log_tail()}"
                raise RedisServerError(msg)
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _spawn(self, exe: str) -> bool:
        assert self._dir is not None
        args = [
            exe,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self._dir),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(self._dir / "redis.log"),
        ]  # fmt: skip
        if self.maxmemory is not None:
            args += ["--maxmemory", str(self.maxmemory), "--maxmemory-policy", self.policy]
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            if _pings(self.port):
                return True
            time.sleep(0.02)
        self.kill()
        return False

    def _log_tail(self) -> str:
        assert self._dir is not None
        try:
            lines = (self._dir / "redis.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:]) or "(empty log)"
