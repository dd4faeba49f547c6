"""Downloading published weights (``oplib.download``) against a local HTTP server on
127.0.0.1: caching, resuming after a dropped connection, a 404, a body that stays short, no
connection at all, and ``weights="paddleclas"`` end to end. Nothing is fetched from outside."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
import torch

import oplib.models
import reference_paddleclas_rednet as paddle_ref
from oplib.download import ATTEMPTS, DownloadError, cached_download

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


class _Server(http.server.ThreadingHTTPServer):
    """Serves ``files`` (path -> bytes) with range requests. ``cut``: path -> how many of the
    first responses to break off after half the bytes promised (a dropped connection);
    ``requests`` records each request's path and Range header."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        server: _Server = self.server
        server.requests.append((self.path, self.headers.get("Range")))
        body = server.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0]) if self.headers.get("Range") else 0
        part = body[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        if server.cut.get(self.path, 0) > 0:
            server.cut[self.path] -= 1
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(part)


@pytest.fixture
def server():
    httpd = _Server()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(server: _Server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_a_download_lands_whole_in_the_cache_and_is_then_reused(server, tmp_path, capsys):
    server.files["/w/a.pdparams"] = PAYLOAD
    path = cached_download(_url(server, "/w/a.pdparams"), tmp_path)
    assert path == tmp_path / "a.pdparams" and path.read_bytes() == PAYLOAD
    assert not list(tmp_path.glob("*.partial"))
    assert "oplib: downloading a.pdparams: 100% of 1.0 MB" in capsys.readouterr().err
    assert cached_download(_url(server, "/w/a.pdparams"), tmp_path) == path
    assert len(server.requests) == 1


def test_a_dropped_connection_is_resumed_with_a_range_request(server, tmp_path):
    server.files["/a.pdparams"] = PAYLOAD
    server.cut["/a.pdparams"] = 2
    path = cached_download(_url(server, "/a.pdparams"), tmp_path, progress=False)
    assert path.read_bytes() == PAYLOAD
    ranges = [header for _, header in server.requests]
    assert ranges[0] is None and ranges[1] == f"bytes={len(PAYLOAD) // 2}-" and len(ranges) == 3


def test_a_body_that_stays_short_keeps_what_came_and_the_next_call_resumes(server, tmp_path):
    server.files["/a.pdparams"] = PAYLOAD
    server.cut["/a.pdparams"] = ATTEMPTS
    with pytest.raises(DownloadError, match=rf"stopped short {ATTEMPTS} times.*the next call resumes from there"):
        cached_download(_url(server, "/a.pdparams"), tmp_path, progress=False)
    assert not (tmp_path / "a.pdparams").exists()
    kept = (tmp_path / "a.pdparams.partial").stat().st_size
    assert 0 < kept < len(PAYLOAD)
    assert cached_download(_url(server, "/a.pdparams"), tmp_path, progress=False).read_bytes() == PAYLOAD
    assert server.requests[-1][1] == f"bytes={kept}-"


def test_a_404_names_the_url_and_where_to_put_the_file(server, tmp_path):
    url = _url(server, "/missing.pdparams")
    with pytest.raises(DownloadError, match=rf"HTTP 404 Not Found\. Fetch {url} by hand and put it at {tmp_path}/missing\.pdparams"):
        cached_download(url, tmp_path, progress=False)
    assert not list(tmp_path.iterdir())


def test_offline_says_which_url_to_fetch_by_hand(tmp_path):
    with socket_without_listener() as port:
        url = f"http://127.0.0.1:{port}/RedNet26_pretrained.pdparams"
        with pytest.raises(DownloadError, match=rf"cannot reach {url} \(.*\)\. Fetch {url} by hand and put it at {tmp_path}/RedNet26"):
            cached_download(url, tmp_path, progress=False)


class socket_without_listener:  # noqa: N801  (a context manager, named for what it gives)
    """A local port bound but not listening: a connection to it is refused, as offline."""

    def __enter__(self) -> int:
        import socket

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        return self.socket.getsockname()[1]

    def __exit__(self, *exc):
        self.socket.close()


def test_weights_paddleclas_downloads_into_the_hub_cache_and_loads(server, tmp_path, monkeypatch):
    reference = paddle_ref.RedNet(26).eval()
    path = paddle_ref.save_pdparams(paddle_ref.paddle_state_dict(reference), tmp_path / "RedNet26_pretrained.pdparams")
    server.files["/dygraph/RedNet26_pretrained.pdparams"] = path.read_bytes()
    monkeypatch.setitem(oplib.models.PADDLECLAS_URLS, 26, _url(server, "/dygraph/RedNet26_pretrained.pdparams"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    model = oplib.models.rednet26(weights="paddleclas").eval()
    assert (tmp_path / "torch-home" / "hub" / "checkpoints" / "RedNet26_pretrained.pdparams").exists()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    oplib.models.rednet26(weights="paddleclas")  # from the cache: no second request
    assert len(server.requests) == 1
