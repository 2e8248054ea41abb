"""A Ray worker's Python, started warm: the command Ray runs instead of ``python`` for each of an
agent's worker processes (``warm_start``), run by path with ``python -I -S`` (the standard
library only: it must itself start in milliseconds).

It asks the agent's fork server for a child already holding Ray, Ray Train, torch,
transformers and peft, hands it this process's standard streams, arguments, environment and
directory, and then stands in for it: Ray's raylet started this process and watches it, so it
lives exactly as long as the child, passes on the signals it gets, and exits as the child
did. Where no fork server answers (or it declines), it becomes the plain ``python`` Ray would
have run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

# Signals a worker's own process may get and its child must see (SIGKILL and SIGSTOP cannot be
# caught: the child leaves with this process (it watches it), and a stopped process group
# stops the child too, as it is in the fork server's group, the agent's).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def main() -> None:
    server, argv = sys.argv[1], sys.argv[2:]
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(server)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "pgid": os.getpgid(0)}
        data = json.dumps(request).encode()
        socket.send_fds(conn, [len(data).to_bytes(8, "big")], [0, 1, 2])
        conn.sendall(data)
        answer = _read(conn, 9)
    except OSError:
        answer = b""
    if answer[:1] != b"P":  # no fork server, or it declined: start cold
        os.execv(sys.executable, [sys.executable, *argv])
    child = int.from_bytes(answer[1:], "big")
    for sig in FORWARDED:
        signal.signal(sig, lambda sig, _frame: _forward(child, sig))
    status = _read(conn, 5)
    if status[:1] != b"X":
        # The fork server died first; the connection ends when the child does.
        os._exit(1)
    code = int.from_bytes(status[1:], "big", signed=True)
    if code < 0:  # the child was killed by a signal: so is its stand-in
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def _forward(child: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, sig)


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        try:
            chunk = conn.recv(size - len(data))
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    return data


if __name__ == "__main__":
    main()
