"""A TCP proxy in front of the S3 server that resets connections mid-response: real network faults."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class FaultyProxy:
    """Forwards to `upstream_port`; the first `resets` connections get the response headers and a few body
    bytes, then a TCP reset (or, with `throttle`, S3's 503 SlowDown). `resets=-1` faults every connection."""

    def __init__(self, upstream_port: int, resets: int, throttle: bool = False) -> None:
        self.upstream_port, self.resets, self.throttle = upstream_port, resets, throttle
        self.connections = 0
        self.reset_count = 0
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop = True
        self._srv.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self.connections += 1
            fault = self.resets < 0 or self.connections <= self.resets
            threading.Thread(target=self._serve, args=(conn, fault), daemon=True).start()

    def _serve(self, conn: socket.socket, fault: bool) -> None:
        if fault and self.throttle:
            self._slow_down(conn)
            return
        up = socket.create_connection(("127.0.0.1", self.upstream_port))
        if not fault:
            threading.Thread(target=_pump, args=(up, conn), daemon=True).start()
            _pump(conn, up)
            return
        try:
            up.sendall(conn.recv(65536))
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = up.recv(65536)
                if not chunk:
                    break
                got += chunk
            head, _, body = got.partition(b"\r\n\r\n")
            conn.sendall(head + b"\r\n\r\n" + body[:10])
        except OSError:
            pass
        finally:
            self.reset_count += 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            up.close()

    def _slow_down(self, conn: socket.socket) -> None:
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>"
        )
        try:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
        except OSError:
            pass
        finally:
            self.reset_count += 1
            conn.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
