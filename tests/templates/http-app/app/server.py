"""Serves the pip-installed package's greeting on port 8000."""
import http.server

import warren_hello


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (warren_hello.greeting() if self.path != "/health" else "ok").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
