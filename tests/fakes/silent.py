"""An endpoint on 127.0.0.1 that accepts every connection and never answers: the worst case for a
client's timeouts (a refused connection fails at once; this one waits for a read timeout)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def silent_endpoint() -> Iterator[tuple[str, int]]:
    """Yields (host, port); every connection is accepted, held open and never written to."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                connection, _ = server.accept()
            except OSError:  # the accept timeout, or the server closed
                continue
            held.append(connection)

    thread = threading.Thread(target=accept, name="silent-endpoint", daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        for connection in held:
            connection.close()
        server.close()
