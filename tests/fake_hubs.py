"""Loopback stand-ins for the model registries we cannot reach in CI, speaking their real protocols.

FakeOllamaRegistry: the Docker-registry v2 API of registry.ollama.ai:
  GET /v2/<ns>/<model>/manifests/<tag>  -> manifest v2 JSON (404 + {"errors": [MANIFEST_UNKNOWN]})
  GET /v2/<ns>/<model>/blobs/<digest>   -> 307 to /cdn/<digest> (the real one redirects to a CDN)
  GET /cdn/<digest>                     -> the bytes, honouring Range (206)
FakeHFHub: the endpoints huggingface_hub calls (HF_ENDPOINT):
  GET  /api/models/<org>/<repo>/tree/<rev>?recursive=..   -> [{"type": "file", "path", "size", "oid", "lfs"}]
  HEAD /<org>/<repo>/resolve/<rev>/<file>  -> X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size, Content-Length
  GET  /<org>/<repo>/resolve/<rev>/<file>  -> the bytes, honouring Range
  unknown repo -> 404 with X-Error-Code: RepoNotFound
Both serve files from disk (the real 0.5B GGUF) or bytes, can cut a body once mid-way
(`cut_after`) and can serve wrong bytes (`corrupt`); `requests` records (method, path, Range).
"""
from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Blob:
    """Bytes or a file on disk, with its sha256 (computed once)."""

    def __init__(self, data: bytes | Path):
        self.data = data
        if isinstance(data, Path):
            self.size = data.stat().st_size
            from engine.hub.store import sha256_file
            self.sha256 = sha256_file(data)
        else:
            self.size, self.sha256 = len(data), hashlib.sha256(data).hexdigest()

    def read(self, start: int):
        """Yields the bytes from `start` in 1 MiB pieces."""
        if isinstance(self.data, Path):
            with open(self.data, "rb") as f:
                f.seek(start)
                while chunk := f.read(1 << 20):
                    yield chunk
        else:
            for i in range(start, self.size, 1 << 20):
                yield self.data[i:i + (1 << 20)]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake = None  # set per server class

    def log_message(self, *a):
        pass

    def _json(self, code: int, obj, headers: dict | None = None):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_blob(self, blob: Blob, headers: dict | None = None):
        fake = self.fake
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(blob.size - start))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{blob.size - 1}/{blob.size}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        cut, sent = fake.cut_after, 0
        fake.cut_after = None  # cut once
        bad = blob.sha256 in fake.corrupt
        for chunk in blob.read(start):
            if bad and sent == 0:
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if cut is not None and sent + len(chunk) >= cut:
                self.wfile.write(chunk[:cut - sent])
                self.wfile.flush()
                fake.served += cut - sent
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(chunk)
            sent += len(chunk)
            fake.served += len(chunk)

    def do_HEAD(self):
        self.do_GET()


class _Fake:
    handler: type = _Handler

    def __init__(self):
        self.cut_after: int | None = None
        self.corrupt: set[str] = set()  # sha256 of blobs served with a flipped first byte
        self.requests: list[tuple[str, str, str | None]] = []
        self.served = 0
        handler = type("H", (self.handler,), {"fake": self})
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class _OllamaHandler(_Handler):
    def do_GET(self):
        fake = self.fake
        fake.requests.append((self.command, self.path, self.headers.get("Range")))
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[0] == "cdn":
            blob = fake.blobs.get(parts[1])
            return self._send_blob(blob) if blob else self._json(404, {"errors": [{"code": "BLOB_UNKNOWN"}]})
        if parts[0] != "v2" or len(parts) != 5:
            return self._json(404, {"errors": [{"code": "NAME_UNKNOWN"}]})
        _, ns, model, kind, ref = parts
        if kind == "manifests":
            m = fake.manifests.get(f"{ns}/{model}:{ref}")
            if m is None or "manifest.v2+json" not in self.headers.get("Accept", ""):
                return self._json(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]})
            return self._json(200, m, {"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"})
        if kind == "blobs" and ref in fake.blobs:
            self.send_response(307)
            self.send_header("Location", f"{fake.url}/cdn/{ref}?X-Amz-Signature=fake")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        return self._json(404, {"errors": [{"code": "BLOB_UNKNOWN"}]})


class FakeOllamaRegistry(_Fake):
    handler = _OllamaHandler

    def __init__(self):
        self.manifests: dict[str, dict] = {}
        self.blobs: dict[str, Blob] = {}  # "sha256:<hex>" -> Blob
        super().__init__()

    def add(self, name: str, model: Blob | bytes | Path, file_type: str = "Q4_K_M"):
        """name 'library/qwen2.5:3b'; layers: model, template, params, license + the image config."""
        model = model if isinstance(model, Blob) else Blob(model)
        small = {"application/vnd.ollama.image.template": b"{{ .Prompt }}",
                 "application/vnd.ollama.image.params": b'{"stop": ["<|im_end|>"]}',
                 "application/vnd.ollama.image.license": b"Apache License 2.0"}
        layers = [("application/vnd.ollama.image.model", model)] + [(t, Blob(b)) for t, b in small.items()]
        config = Blob(json.dumps({"model_format": "gguf", "model_family": "qwen2", "file_type": file_type}).encode())
        for _, b in layers + [("", config)]:
            self.blobs[f"sha256:{b.sha256}"] = b
        self.manifests[name] = {
            "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": f"sha256:{config.sha256}", "size": config.size},
            "layers": [{"mediaType": t, "digest": f"sha256:{b.sha256}", "size": b.size} for t, b in layers]}
        return model


class _HFHandler(_Handler):
    def do_GET(self):
        fake = self.fake
        fake.requests.append((self.command, self.path, self.headers.get("Range")))
        path = self.path.split("?")[0]
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
            repo = fake.repos.get("/".join(parts[2:4]))
            if repo is None:
                return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            return self._json(200, [fake.entry(f, b) for f, b in repo.items()])
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = fake.repos.get("/".join(parts[:2]))
            if repo is None:
                return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            blob = repo.get("/".join(parts[4:]))
            if blob is None:
                return self._json(404, {"error": "Entry not found"},
                                  {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
            return self._send_blob(blob, {"X-Repo-Commit": COMMIT, "ETag": f'"{blob.sha256}"',
                                          "X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size),
                                          "Accept-Ranges": "bytes"})
        return self._json(404, {"error": "not found"})


class FakeHFHub(_Fake):
    handler = _HFHandler

    def __init__(self):
        self.repos: dict[str, dict[str, Blob]] = {}
        self.wrong_lfs: set[str] = set()  # files whose listed sha256 is wrong
        super().__init__()

    def add(self, repo: str, files: dict[str, bytes | Path | Blob]):
        self.repos[repo] = {f: b if isinstance(b, Blob) else Blob(b) for f, b in files.items()}

    def entry(self, path: str, b: Blob) -> dict:
        e = {"type": "file", "path": path, "size": b.size, "oid": hashlib.sha1(path.encode()).hexdigest()}
        if path.endswith((".gguf", ".safetensors")):
            sha = "0" * 64 if path in self.wrong_lfs else b.sha256
            e["lfs"] = {"oid": sha, "size": b.size, "pointerSize": 134}
        return e
