"""A Hugging Face hub in this process, for tests without the internet: the endpoints huggingface_hub reads
(a repository's file tree, and each file's resolve URL with the commit and ETag headers it checks), serving the
files put in FILES. Point HF_ENDPOINT at serve()'s address."""
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

FILES: dict = {}   # (repo, path) -> bytes
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LOG: list = []     # (method, path) of every request

class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers: self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD": self.wfile.write(body)
    def do_HEAD(self): self.do_GET()
    def do_GET(self):
        u = urlparse(self.path); p = u.path
        LOG.append((self.command, self.path))
        if p.startswith("/api/models/"):
            rest = p[len("/api/models/"):]
            parts = rest.split("/")
            repo = "/".join(parts[:2])
            files = [(path, data) for (r, path), data in FILES.items() if r == repo]
            if not files:  # as the real hub answers a repository that is missing (or private)
                return self._send(401, b'{"error": "Repository not found"}',
                                  [("X-Error-Code", "RepoNotFound"), ("Content-Type", "application/json")])
            if len(parts) > 2 and parts[2] == "tree":
                body = json.dumps([{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()} for f, d in files]).encode()
                return self._send(200, body, [("Content-Type", "application/json")])
            body = json.dumps({"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f, _ in files]}).encode()
            return self._send(200, body, [("Content-Type", "application/json")])
        parts = p.strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = "/".join(parts[:2]); path = "/".join(parts[4:])
            data = FILES.get((repo, path))
            if data is None: return self._send(404, b"", [("X-Error-Code", "EntryNotFound")])
            etag = '"' + hashlib.sha256(data).hexdigest() + '"'
            return self._send(200, data, [("X-Repo-Commit", COMMIT), ("ETag", etag), ("Content-Type", "application/octet-stream")])
        self._send(404)

def serve():
    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s
