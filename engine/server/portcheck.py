"""Bind the listening socket ourselves so "port in use" is a clear one-line error naming the
process that holds it (psutil if installed, else /proc/net/tcp + /proc/*/fd on Linux)."""
from __future__ import annotations

import errno
import os
import socket

from engine.errors import ResourceError


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if os.name != "nt":  # on Windows SO_REUSEADDR would let two servers share the port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)) or "in use" in str(e).lower():
            who = port_owner(port)
            raise ResourceError(f"port {port} on {host} is already in use" + (f" by {who}" if who else ""),
                                f"stop that program or choose another port, e.g. --port {port + 1}") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ResourceError(f"cannot listen on {host}: not an address of this machine",
                                "use --host 127.0.0.1") from None
        if e.errno == errno.EACCES:
            raise ResourceError(f"no permission to listen on port {port}", "use a port above 1024") from None
        raise ResourceError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def port_owner(port: int) -> str | None:
    """'pid 1234 (python -m http.server 18000)' or None when it cannot be found out."""
    try:
        import psutil  # optional: not a dependency

        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                p = psutil.Process(c.pid)
                return f"pid {c.pid} ({' '.join(p.cmdline()) or p.name()})"
    except Exception:
        pass
    inodes = _listen_inodes(port)
    if not inodes:
        return None
    for pid in filter(str.isdigit, _listdir("/proc")):
        for fd in _listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return f"pid {pid} ({_cmdline(pid)})"
    return "another process (its id is not visible to this user)"


def _listen_inodes(port: int) -> set[str]:
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                        out.add(cols[9])
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200] or "?"
    except OSError:
        return "?"
