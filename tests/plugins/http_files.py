"""pytest plugin: files served over plain HTTP on loopback (Python's http.server in a thread of the test process).

`http_files` gives a test an empty folder of its own and its URL on a server that runs for the whole session:
what the test writes there, fsspec's HTTPFileSystem (aiohttp) reads back as http://127.0.0.1:PORT/<folder>/<file>.
"""

from __future__ import annotations

import functools
import itertools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

_folders = itertools.count()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def http_root(tmp_path_factory):
    """(base URL, folder) of the session's file server."""
    root = tmp_path_factory.mktemp("http")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="http-files", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_files(http_root):
    """(URL, folder): an empty folder of this test's own and the URL it is served under."""
    base, root = http_root
    name = f"t{next(_folders)}"
    (root / name).mkdir()
    return f"{base}/{name}", root / name
