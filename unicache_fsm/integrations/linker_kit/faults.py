"""Backend faults a linker author can let the kit inject, and two ready implementations.

The interface (`BackendFaults`) is optional: a linker offers it by returning one from a
``backend_faults()`` method; without it the fault obligations are reported not
applicable. Keys are SGLang's page hashes (the ``keys`` of a `PoolTransfer`).

- `lose(key)` / `corrupt(key)` / `truncate(key)` — delete, flip one bit of, or cut in half
  every stored object of that page; True when something was there.
- `fail_next_write()` — the backend's next write fails (`write_failure_armed` stays True
  until one did).
- `set_reachable(flag)` — cut the backend off, or bring it back.

`DirectoryFaults(root)` — for linkers that keep pages as files under one directory whose
names contain the page hash: it damages the files in place and takes the directory
away (renames it) while unreachable. A write failure needs the linker's help: call
`guard_write()` before each write (it raises `OSError` once when armed).

`RedisFaults(client, pattern="*{key}*")` — for linkers that keep pages as Redis values
whose names contain the page hash: it damages the values with GET/SET/DEL, and while
unreachable sets a password and drops every other client (``CLIENT KILL``); the same
`guard_write()` arms a write failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["FAULT_KINDS", "BackendFaults", "DirectoryFaults", "RedisFaults"]

#: the fault kinds ``check-linker --faults`` names
FAULT_KINDS = ("lose", "corrupt", "truncate", "write", "unreachable")


@runtime_checkable
class BackendFaults(Protocol):
    """What the kit may do to a linker's backing store (module docstring)."""

    write_failure_armed: bool

    def lose(self, key: str) -> bool: ...
    def corrupt(self, key: str) -> bool: ...
    def truncate(self, key: str) -> bool: ...
    def fail_next_write(self) -> None: ...
    def set_reachable(self, reachable: bool) -> None: ...


class _WriteGuard:
    write_failure_armed = False

    def fail_next_write(self) -> None:
        self.write_failure_armed = True

    def guard_write(self) -> None:
        """Call before each backend write: raises `OSError` once after `fail_next_write`."""
        if self.write_failure_armed:
            self.write_failure_armed = False
            msg = "injected write failure (BackendFaults.fail_next_write)"
            raise OSError(msg)


class DirectoryFaults(_WriteGuard):
    """`BackendFaults` over a directory of page files (module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._away = self.root.with_name(self.root.name + ".unreachable")

    def _files(self, key: str) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.rglob(f"*{key}*") if p.is_file())

    def lose(self, key: str) -> bool:
        files = self._files(key)
        for path in files:
            path.unlink()
        return bool(files)

    def corrupt(self, key: str) -> bool:
        files = [p for p in self._files(key) if p.stat().st_size > 0]
        for path in files:
            with path.open("r+b") as f:
                f.seek(path.stat().st_size // 2)
                byte = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([byte[0] ^ 0x10]))
        return bool(files)

    def truncate(self, key: str) -> bool:
        files = self._files(key)
        for path in files:
            os.truncate(path, path.stat().st_size // 2)
        return bool(files)

    def set_reachable(self, reachable: bool) -> None:
        if not reachable:
            if self.root.exists() and not self._away.exists():
                self.root.rename(self._away)
            return
        if not self._away.exists():
            return
        if self.root.exists():  # recreated while away: what was written there stays
            shutil.copytree(self._away, self.root, dirs_exist_ok=True)
            shutil.rmtree(self._away)
        else:
            self._away.rename(self.root)


class RedisFaults(_WriteGuard):
    """`BackendFaults` over a Redis server's values (module docstring)."""

    _PASSWORD = "unicache-check-linker-unreachable"

    def __init__(self, client: Any, pattern: str = "*{key}*") -> None:
        self.client = client
        self.pattern = pattern
        self._cut = False

    def _names(self, key: str) -> list[Any]:
        return list(self.client.scan_iter(match=self.pattern.format(key=key)))

    def lose(self, key: str) -> bool:
        names = self._names(key)
        if names:
            self.client.delete(*names)
        return bool(names)

    def _rewrite(self, key: str, change: Any) -> bool:
        done = False
        for name in self._names(key):
            value = self.client.get(name)
            if value:
                self.client.set(name, change(bytes(value)))
                done = True
        return done

    def corrupt(self, key: str) -> bool:
        def flip(v: bytes) -> bytes:
            i = len(v) // 2
            return v[:i] + bytes([v[i] ^ 0x10]) + v[i + 1 :]

        return self._rewrite(key, flip)

    def truncate(self, key: str) -> bool:
        return self._rewrite(key, lambda v: v[: len(v) // 2])

    def set_reachable(self, reachable: bool) -> None:
        if not reachable and not self._cut:
            self.client.config_set("requirepass", self._PASSWORD)
            self.client.execute_command("AUTH", self._PASSWORD)
            self.client.client_kill_filter(skipme=True, _type="normal")
            self._cut = True
        elif reachable and self._cut:
            self.client.config_set("requirepass", "")
            self._cut = False
