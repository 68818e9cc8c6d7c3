"""A static file server for the built app, with the MIME types a PWA and WebAssembly need.

Python's `http.server`, threaded, over the build folder; HTTPS when given a certificate, since
a phone grants the camera and the service worker only to HTTPS pages (or localhost).
"""

import functools
import socket
import ssl
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

MIME_TYPES = {
    ".wasm": "application/wasm",  # WebAssembly.instantiateStreaming insists on it
    ".webmanifest": "application/manifest+json",
    ".js": "text/javascript",
    ".json": "application/json",
    ".tflite": "application/octet-stream",
}


class _Handler(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}

    def end_headers(self):
        # Revalidate on every visit: the service worker is the app's cache, not the browser's.
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def log_message(self, format, *args):
        if self.server.verbose:
            super().log_message(format, *args)


def make_server(folder, host="127.0.0.1", port=8000, certfile=None, keyfile=None, verbose=False):
    """A server for `folder` bound to `host:port` (port 0 picks a free one); not yet serving.

    Raises:
        ValueError: the port is taken, the host cannot be bound, or the certificate is unusable.
    """
    handler = functools.partial(_Handler, directory=str(folder))
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as error:
        raise ValueError(
            f"Cannot serve on {host}:{port} ({error.strerror}); pass another --port or --host."
        ) from None
    server.verbose = verbose
    server.daemon_threads = True
    if certfile:
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as error:
            server.server_close()
            raise ValueError(f"Cannot use the certificate {certfile} ({error}).") from None
        server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def urls(server):
    """The addresses to open: localhost, and this machine's own addresses when bound to all."""
    host, port = server.server_address[:2]
    scheme = "https" if isinstance(server.socket, ssl.SSLSocket) else "http"
    if host not in ("0.0.0.0", "::"):
        return [f"{scheme}://{'localhost' if host == '127.0.0.1' else host}:{port}/"]
    names = {"localhost"}
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            if not info[4][0].startswith("127."):
                names.add(info[4][0])
    except OSError:
        pass
    return [f"{scheme}://{name}:{port}/" for name in sorted(names)]


def serve_in_background(server):
    """Serves on a daemon thread (for tests and screenshots); `server.shutdown()` stops it."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread
