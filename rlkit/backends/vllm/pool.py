"""Many vLLM servers as one sampler: least-loaded routing and adapters loaded by version.

- **Routing.** Each request goes to the server with the fewest requests in flight (ties: the
  first listed). A group's ``num_samples=G`` is one request (vLLM's ``n``), so it stays on one
  server and its prompt is prefilled once.
- **Adapter versions.** Every published weight version is a PEFT adapter directory with a
  unique name (``<session>-v<k>``). :meth:`acquire` loads it on every server and counts the
  sampling clients that hold it; :meth:`release` unloads it once none does, and deletes its
  directory when rlkit wrote it. Adapters live in a directory every server can read — on one
  machine any local path; for servers on other nodes a shared filesystem (NFS, Lustre, EFS)
  mounted at the same path, or at ``adapter_dir_on_server`` (docs/scale.md).
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from rlkit.backends.vllm.http import VllmServer
from rlkit.errors import ConfigError

log = logging.getLogger("rlkit.vllm")


class ServerPool:
    def __init__(self, servers: Sequence[VllmServer], base_name: str, *, adapter_dir_on_server: Optional[str] = None,
                 local_adapter_dir: Optional[str] = None):
        if not servers:
            raise ConfigError("backend.vllm: no servers (set backend.vllm.urls=[...] or backend.vllm.launch=true)")
        self.servers: List[VllmServer] = list(servers)
        self.base_name = base_name
        self.adapter_dir_on_server = adapter_dir_on_server
        self.local_adapter_dir = local_adapter_dir
        self._lock = threading.Lock()
        self._holders: Dict[str, int] = {}  # adapter name -> sampling clients holding it
        self._paths: Dict[str, Path] = {}  # adapter name -> local directory
        self._owned: Dict[str, bool] = {}  # rlkit wrote the directory (deleted once unloaded)
        self.loads = self.unloads = 0

    # -- routing ---------------------------------------------------------------------------------
    def pick(self) -> VllmServer:
        """The least-loaded server, its in-flight count already taken (give it back with :meth:`done`)."""
        with self._lock:
            server = min(self.servers, key=lambda s: s.in_flight)
            server.in_flight += 1
            return server

    def done(self, server: VllmServer) -> None:
        with self._lock:
            server.in_flight -= 1

    # -- adapters ---------------------------------------------------------------------------------
    def server_path(self, local: Path) -> str:
        """``local`` as the servers see it: the same path, or re-rooted at ``adapter_dir_on_server``."""
        local = Path(local).resolve()
        if self.adapter_dir_on_server and self.local_adapter_dir:
            try:
                return str(Path(self.adapter_dir_on_server) / local.relative_to(Path(self.local_adapter_dir).resolve()))
            except ValueError:
                pass
        return str(local)

    def acquire(self, name: str, path: Path, *, owned: bool = True) -> None:
        """One more holder of adapter ``name`` (loaded from ``path`` on every server the first time)."""
        with self._lock:
            first = name not in self._holders
            self._holders[name] = self._holders.get(name, 0) + 1
            self._paths[name], self._owned[name] = Path(path), owned and self._owned.get(name, True)
        if first:
            try:
                for server in self.servers:
                    server.load_adapter(name, self.server_path(path))
                self.loads += 1
            except BaseException:
                self.release(name)
                raise

    def release(self, name: str) -> None:
        """One holder fewer; at none, ``name`` is unloaded from every server (and its directory removed)."""
        with self._lock:
            if name not in self._holders:
                return
            self._holders[name] -= 1
            if self._holders[name] > 0:
                return
            del self._holders[name]
            path, owned = self._paths.pop(name), self._owned.pop(name)
        for server in self.servers:
            try:
                server.unload_adapter(name)
            except Exception as exc:  # noqa: BLE001 - a dead server holds nothing; the next request says so
                log.debug("unloading %s from %s: %s", name, server.url, exc)
        self.unloads += 1
        if owned:
            shutil.rmtree(path, ignore_errors=True)

    def held(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._holders)

    def release_all(self) -> None:
        for name in list(self.held()):
            with self._lock:
                if name in self._holders:
                    self._holders[name] = 1
            self.release(name)
