# TEMPORARY dev stand-in for services.envd (deleted once the real daemon has a __main__).
import argparse, os
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from urllib.parse import urlparse, parse_qs

p = argparse.ArgumentParser()
p.add_argument("--listen")
p.add_argument("--access-token")
p.add_argument("--root")
a = p.parse_args()
host, port = a.listen.rsplit(":", 1)


class H(BaseHTTPRequestHandler):
    def _path(self):
        q = parse_qs(urlparse(self.path).query)
        return os.path.join(a.root, q["path"][0])

    def do_GET(self):
        u = urlparse(self.path)
        if u.path == "/health":
            self.send_response(204)
            self.end_headers()
            return
        try:
            data = open(self._path(), "rb").read()
        except OSError:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        body = self.rfile.read(n)
        if body.startswith(b"--"):
            b = body.split(b"\r\n", 1)[0]
            body = body.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n" + b, 1)[0]
        open(self._path(), "wb").write(body)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"[]")


ThreadingHTTPServer((host, int(port)), H).serve_forever()
