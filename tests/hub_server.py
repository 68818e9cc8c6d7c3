"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests that download pretrained models.

It answers what `huggingface_hub.hf_hub_download` asks, as the hub does:
`HEAD`/`GET /{org}/{name}/resolve/{revision}/{file}` with `X-Repo-Commit`, `ETag` and
`Content-Length` (and `Range` for resumed downloads), 404 with `X-Error-Code`
(`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) for what does not exist, and 401 with
`GatedRepo` for a gated repo asked without its token. Repos are folders
under `root` (`root/org/name/...`) that tests write, e.g. with `timm.models.save_for_hf`.

conftest.py starts one per test process and points `HF_ENDPOINT` at it before anything imports
huggingface_hub, which reads its settings at import.
"""

import hashlib
import http.server
import os
import socket
import threading
import urllib.parse


class HubServer:
    """Serves the repos under `root`. `cut_files`: names whose GET sends half the bytes and then
    closes the connection, as a network that drops mid-download. `gated`: `{repo: token}`, repos
    served only to requests that carry `Authorization: Bearer <token>`. `requests`: the paths asked."""

    def __init__(self, root):
        self.root = os.fspath(root)
        self.cut_files = set()
        self.gated = {}
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                server._connections.add(self.connection)

            def finish(self):
                server._connections.discard(self.connection)
                super().finish()

            def do_HEAD(self):
                server._answer(self, send_body=False)

            def do_GET(self):
                server._answer(self, send_body=True)

            def log_message(self, *args):
                pass

        self._handler = Handler
        self._connections = set()  # kept alive by clients between requests
        self._port = 0
        self.start()
        self.url = f"http://127.0.0.1:{self._port}"

    def start(self):
        """Serves (again, on the same port after `stop`)."""
        self._httpd = _QuietServer(("127.0.0.1", self._port), self._handler)
        self._port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self):
        """Closes the port and every open connection, as a network that is down: new
        connections are refused, kept-alive ones end."""
        self._httpd.shutdown()
        self._httpd.server_close()
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def repo_folder(self, repo):
        return os.path.join(self.root, *repo.split("/"))

    def commit(self, repo):
        """The repo's commit: a hash of its files' names and contents."""
        digest = hashlib.sha1()
        folder = self.repo_folder(repo)
        for name in sorted(os.listdir(folder)):
            digest.update(name.encode())
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        return digest.hexdigest()

    def _answer(self, handler, send_body):
        path = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path)
        self.requests.append((handler.command, path))
        parts = path.strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._refuse(handler, 404, "RepoNotFound", "Repository Not Found")
        repo, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        folder = self.repo_folder(repo)
        if not os.path.isdir(folder):
            return self._refuse(handler, 404, "RepoNotFound", "Repository Not Found")
        if repo in self.gated and handler.headers.get("Authorization") != f"Bearer {self.gated[repo]}":
            message = f"Access to model {repo} is restricted: you must be authenticated."
            return self._refuse(handler, 401, "GatedRepo", message)
        commit = self.commit(repo)
        if revision not in ("main", commit):
            return self._refuse(handler, 404, "RevisionNotFound", "Invalid rev id")
        file = os.path.join(folder, filename)
        if not os.path.isfile(file):
            return self._refuse(handler, 404, "EntryNotFound", "Entry not found", commit)
        with open(file, "rb") as f:
            data = f.read()
        start = _range_start(handler.headers.get("Range"))
        body = data[start:]
        handler.send_response(206 if start else 200)
        handler.send_header("X-Repo-Commit", commit)
        handler.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        handler.send_header("Content-Length", str(len(body)))
        if start:
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        handler.end_headers()
        if not send_body:
            return
        if filename in self.cut_files:
            handler.wfile.write(body[: len(body) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(2)
            return
        handler.wfile.write(body)

    @staticmethod
    def _refuse(handler, status, code, message, commit=None):
        body = f'{{"error": "{message}"}}'.encode()
        handler.send_response(status)
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        if commit:
            handler.send_header("X-Repo-Commit", commit)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command == "GET":
            handler.wfile.write(body)


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client gone mid-answer (a cut download, a stopped server) is what the tests make


def _range_start(header):
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes=") :].split("-")[0] or 0)
