"""A TCP forwarder from the node's bridge address to the API server on loopback.

The envtest API server listens on 127.0.0.1 only, which a pod's network namespace
cannot reach. Pods reach it as in a cluster, through the ``kubernetes`` Service
(10.0.0.1:443, ``KUBERNETES_SERVICE_HOST``): services.py DNATs that address to this
forwarder. Bytes are passed through untouched (TLS ends at the API server, whose
certificate names 10.0.0.1 and kubernetes.default.svc).
"""

from __future__ import annotations

import socket
import threading


class Forwarder:
    def __init__(self, listen_host: str, target: tuple[str, int]):
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((listen_host, 0))
        self.sock.listen(64)
        self.address = self.sock.getsockname()
        self._thread = threading.Thread(target=self._accept, name="apiproxy", daemon=True)

    def start(self) -> "Forwarder":
        self._thread.start()
        return self

    def stop(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
