"""Warren's code-interpreter server: the HTTP API the `e2b_code_interpreter` SDKs call on port 49999
inside a sandbox of the built-in `code-interpreter` template, in front of Jupyter kernels (Python and, where
its kernelspec is installed, Bash).

Python standard library (http.server) plus jupyter_client, which speaks Jupyter's wire protocol over
ZeroMQ. Kernels use ZeroMQ's `ipc` transport (Unix sockets under /tmp), so a checkpoint of the sandbox
(CRIU) carries the kernels and their connections without TCP repair.

Endpoints (what the SDK sends):
  GET    /health                      200 "OK"
  POST   /execute                     {code, context_id?, language?, env_vars?} -> JSON lines, streamed
  POST   /contexts                    {language?, cwd?} -> {id, language, cwd}
  GET    /contexts                    [{id, language, cwd}]
  POST   /contexts/{id}/restart       restarts the kernel (variables are lost), same id
  DELETE /contexts/{id}               shuts the kernel down

Streamed lines of /execute, one JSON object each:
  {"type": "number_of_executions", "execution_count": n}
  {"type": "stdout"|"stderr", "text": ..., "timestamp": ISO-8601}
  {"type": "result", "is_main_result": bool, "text"?, "html"?, "png"?, ..., "chart"?, "data"?, "extra"?}
  {"type": "error", "name": ..., "value": ..., "traceback": ...}
  {"type": "keepalive"}                 while a cell runs silently (so a gone client is noticed)
  {"type": "end_of_execution"}          always last
A client that goes away (the SDK's `timeout`) interrupts the cell, so the context stays usable.
"""

import datetime
import json
import logging
import os
import queue
import re
import shlex
import shutil
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client.manager import KernelManager

PORT = int(os.environ.get("WARREN_INTERPRETER_PORT", "49999"))
ENVD_ENVS_URL = "http://127.0.0.1:49983/envs"
DEFAULT_CWD = "/home/user"
KERNEL_READY_TIMEOUT_S = 120
# A line is written at least this often while a cell runs, so a client that went away is noticed.
KEEPALIVE_S = 1.0
SOCKET_DIR = "/tmp/warren-interpreter"

# Languages a context can have, with their Jupyter kernel name. Only kernels installed in this template
# are offered (see installed_kernels): anything else is refused with 400 naming the language.
KNOWN_KERNELS = {
    "python": "python3",
    "bash": "bash",
    "javascript": "javascript",
    "typescript": "typescript",
    "r": "ir",
}
LANGUAGE_ALIASES = {
    "python3": "python",
    "py": "python",
    "sh": "bash",
    "shell": "bash",
    "js": "javascript",
    "node": "javascript",
    "nodejs": "javascript",
    "ts": "typescript",
}
# What a kernel runs besides its kernelspec: a spec whose program is missing is not offered.
KERNEL_PROGRAMS = {"javascript": "node", "typescript": "node", "r": "R"}
# ...and what it needs besides: TypeScript cells are transpiled with npm's `typescript`.
KERNEL_FILES = {"typescript": "/usr/local/lib/node_modules/typescript/package.json"}
SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def installed_kernels():
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    return {
        language: kernel
        for language, kernel in KNOWN_KERNELS.items()
        if kernel in specs
        and shutil.which(KERNEL_PROGRAMS.get(language, "sh"))
        and os.path.exists(KERNEL_FILES.get(language, "/"))
    }


KERNELS = installed_kernels()

# MIME types the SDK's Result has a field for.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

log = logging.getLogger("warren-interpreter")


class RequestError(Exception):
    """A request the server refuses: HTTP status and a message naming the problem."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def normalize_language(language):
    if language is None:
        return "python"
    if not isinstance(language, str):
        raise RequestError(400, "language must be a string")
    name = language.strip().lower()
    return LANGUAGE_ALIASES.get(name, name)


def kernel_for(language):
    kernel = KERNELS.get(language)
    if kernel is None:
        available = ", ".join(sorted(KERNELS))
        raise RequestError(
            400,
            f"language '{language}' has no kernel in this template (available: {available})",
        )
    return kernel


def iso(value):
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.isoformat()
    return str(value) if value is not None else datetime.datetime.now(datetime.timezone.utc).isoformat()


def result_line(content, is_main_result):
    """A display_data/execute_result bundle as the SDK's Result: one field per known MIME type, the rest in
    `extra`. A plain-text repr of a string loses its quotes, as E2B's server does."""
    line = {"type": "result", "is_main_result": is_main_result}
    extra = {}
    for mime, value in (content.get("data") or {}).items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            line[field] = value
    text = line.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        line["text"] = text[1:-1]
    if extra:
        line["extra"] = extra
    return line


class Dialect:
    """What every kernel's bookkeeping shares: any env var name is fine, and only an execute_result is
    the cell's main result."""

    DISPLAY_IS_MAIN_RESULT = False

    @staticmethod
    def check_env_names(names):
        return None


class PythonDialect(Dialect):
    """Bookkeeping code for a Python kernel: environment variables and the working directory."""

    @staticmethod
    def set_env(assign):
        return f"import os as __warren_os\n__warren_os.environ.update({json.dumps(assign)})\ndel __warren_os\n"

    @staticmethod
    def begin_scoped_env(assign):
        """Saves the current values of `assign`'s names in the kernel, then sets them."""
        return (
            "import os as __warren_os\n"
            f"__warren_saved_env = {{k: __warren_os.environ.get(k) for k in {json.dumps(sorted(assign))}}}\n"
            f"__warren_os.environ.update({json.dumps(assign)})\n"
            "del __warren_os\n"
        )

    @staticmethod
    def end_scoped_env(assign):
        """Puts back what begin_scoped_env saved: the old value, or no variable at all."""
        return (
            "import os as __warren_os\n"
            "for __warren_k, __warren_v in __warren_saved_env.items():\n"
            "    if __warren_v is None: __warren_os.environ.pop(__warren_k, None)\n"
            "    else: __warren_os.environ[__warren_k] = __warren_v\n"
            "del __warren_os, __warren_saved_env\n"
        )

    @staticmethod
    def chdir(path):
        return f"import os as __warren_os\n__warren_os.chdir({json.dumps(path)})\ndel __warren_os\n"


class BashDialect(Dialect):
    """Bookkeeping code for a Bash kernel (a bash process behind bash_kernel)."""

    @staticmethod
    def check_env_names(names):
        bad = [n for n in names if not SHELL_NAME.match(n)]
        return f"env var names {bad} are not shell variable names" if bad else None

    @staticmethod
    def set_env(assign):
        return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in assign.items())

    @staticmethod
    def begin_scoped_env(assign):
        return "\n".join(
            f'__warren_had_{k}="${{{k}+1}}"; __warren_was_{k}="${{{k}-}}"; export {k}={shlex.quote(v)}'
            for k, v in assign.items()
        )

    @staticmethod
    def end_scoped_env(assign):
        return "\n".join(
            f'if [ -n "$__warren_had_{k}" ]; then export {k}="$__warren_was_{k}"; else unset {k}; fi; '
            f"unset __warren_had_{k} __warren_was_{k}"
            for k in assign
        )

    @staticmethod
    def chdir(path):
        return f"cd {shlex.quote(path)}"


class JavaScriptDialect(Dialect):
    """Bookkeeping code for Warren's JavaScript kernel (one Node.js process)."""

    @staticmethod
    def set_env(assign):
        return f"Object.assign(process.env, {json.dumps(assign)});"

    @staticmethod
    def begin_scoped_env(assign):
        return (
            f"globalThis.__warren_saved_env = Object.fromEntries({json.dumps(sorted(assign))}"
            ".map((k) => [k, process.env[k]]));"
            f"Object.assign(process.env, {json.dumps(assign)});"
        )

    @staticmethod
    def end_scoped_env(assign):
        return (
            "for (const [k, v] of Object.entries(globalThis.__warren_saved_env)) {"
            " if (v === undefined) delete process.env[k]; else process.env[k] = v; }"
            "delete globalThis.__warren_saved_env;"
        )

    @staticmethod
    def chdir(path):
        return f"process.chdir({json.dumps(path)});"


def r_string(text):
    """`text` as an R string literal (R reads JSON's escapes, \\uXXXX included)."""
    return json.dumps(text)


class RDialect(Dialect):
    """Bookkeeping code for an R kernel (IRkernel)."""

    # IRkernel shows the value of a cell's visible expressions as display_data, never as
    # execute_result: those are the cell's result (`Execution.text`), as a notebook shows them.
    DISPLAY_IS_MAIN_RESULT = True

    @staticmethod
    def check_env_names(names):
        bad = [n for n in names if "`" in n or "\\" in n or not n]
        return f"env var names {bad} cannot be set from R" if bad else None

    @staticmethod
    def set_env(assign):
        pairs = ", ".join(f"`{k}` = {r_string(v)}" for k, v in assign.items())
        return f"invisible(Sys.setenv({pairs}))"

    @staticmethod
    def begin_scoped_env(assign):
        names = ", ".join(r_string(k) for k in sorted(assign))
        return (
            f".warren_saved_env <- Sys.getenv(c({names}), unset = NA, names = TRUE)\n"
            + RDialect.set_env(assign)
        )

    @staticmethod
    def end_scoped_env(assign):
        return (
            "for (.warren_k in names(.warren_saved_env)) {"
            " if (is.na(.warren_saved_env[[.warren_k]])) Sys.unsetenv(.warren_k)"
            " else do.call(Sys.setenv, setNames(list(.warren_saved_env[[.warren_k]]), .warren_k)) }\n"
            "rm(.warren_saved_env, .warren_k)"
        )

    @staticmethod
    def chdir(path):
        return f"setwd({r_string(path)})"


DIALECTS = {
    "python": PythonDialect,
    "bash": BashDialect,
    "javascript": JavaScriptDialect,
    "typescript": JavaScriptDialect,
    "r": RDialect,
}


class ClientGone(Exception):
    """The HTTP client stopped reading (closed the connection)."""


class Context:
    """One Jupyter kernel and the client that talks to it. One cell runs at a time (the lock)."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.dialect = DIALECTS[language]
        self.cwd = cwd
        self.lock = threading.Lock()
        self.globals_applied = False
        self.restarting = False
        self.manager = None
        self.client = None
        self._start()

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def _start(self):
        os.makedirs(SOCKET_DIR, exist_ok=True)
        manager = KernelManager(
            kernel_name=kernel_for(self.language),
            transport="ipc",
            ip=os.path.join(SOCKET_DIR, self.id),
        )
        manager.start_kernel(cwd=self.cwd if os.path.isdir(self.cwd) else DEFAULT_CWD)
        client = manager.client()
        client.start_channels(hb=False)
        try:
            client.wait_for_ready(timeout=KERNEL_READY_TIMEOUT_S)
        except RuntimeError:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
            raise
        self.manager = manager
        self.client = client
        if self.cwd != DEFAULT_CWD:
            self.run_silent(self.dialect.chdir(self.cwd))

    def restart(self):
        # The kernel is killed before the lock is taken: a cell that never ends (one that ignores
        # SIGINT) holds the lock, and its request ends with KernelDied once the kernel is gone.
        self.restarting = True
        self.manager.shutdown_kernel(now=True)
        with self.lock:
            self.client.stop_channels()
            self.globals_applied = False
            self._start()
            self.restarting = False

    def shutdown(self):
        self.manager.shutdown_kernel(now=True)
        with self.lock:
            self.client.stop_channels()

    def _drain(self, msg_id, on_message, deadline=None):
        """Reads iopub until the kernel is idle after `msg_id`, passing that cell's messages on."""
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("kernel did not finish a silent cell")
            try:
                msg = self.client.get_iopub_msg(timeout=KEEPALIVE_S)
            except queue.Empty:
                if not self.manager.is_alive():
                    on_message(None)
                    return
                on_message({"msg_type": "keepalive"})
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                return
            on_message(msg)

    def run_silent(self, code):
        """Runs bookkeeping code (env vars, cwd) without a history entry; returns an error text or None."""
        msg_id = self.client.execute(code, silent=True, store_history=False, allow_stdin=False)
        errors = []

        def collect(msg):
            if msg is not None and msg["msg_type"] == "error":
                errors.append(f"{msg['content'].get('ename')}: {msg['content'].get('evalue')}")

        self._drain(msg_id, collect, deadline=time.monotonic() + 60)
        return errors[0] if errors else None

    def execute(self, code, env_vars, access_token, emit):
        """Runs one cell, calling `emit(line)` for each output line; `emit` raises ClientGone when the
        client left, which interrupts the cell."""
        with self.lock:
            if not self.manager.is_alive():
                self.globals_applied = False
                self.client.stop_channels()
                self._start()
            if not self.globals_applied:
                envs = sandbox_envs(access_token)
                usable = {k: v for k, v in envs.items() if self.dialect.check_env_names([k]) is None}
                if usable:
                    self.run_silent(self.dialect.set_env(usable))
                self.globals_applied = True
            if env_vars:
                refused = self.dialect.check_env_names(list(env_vars))
                failure = refused or self.run_silent(self.dialect.begin_scoped_env(env_vars))
                if failure:
                    emit({"type": "error", "name": "EnvVarsError", "value": failure, "traceback": ""})
                    return
            try:
                self._execute_cell(code, emit)
            finally:
                if env_vars:
                    self.run_silent(self.dialect.end_scoped_env(env_vars))

    def _shell_reply(self, msg_id):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                reply = self.client.get_shell_msg(timeout=KEEPALIVE_S)
            except queue.Empty:
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return reply
        raise TimeoutError("kernel did not answer")

    def _execute_cell(self, code, emit):
        msg_id = self.client.execute(code, silent=False, store_history=True, allow_stdin=False, stop_on_error=True)
        state = {"errored": False, "interrupted": False}

        def forward(msg):
            if msg is None:
                if self.restarting:
                    emit({"type": "error", "name": "ContextRestarting", "value": "the context was restarted", "traceback": ""})
                else:
                    emit({"type": "error", "name": "KernelDied", "value": "the kernel exited while running the cell", "traceback": ""})
                raise KernelDied()
            kind = msg["msg_type"]
            content = msg.get("content", {})
            try:
                if kind == "keepalive":
                    emit({"type": "keepalive"})
                elif kind == "execute_input":
                    emit({"type": "number_of_executions", "execution_count": content.get("execution_count")})
                elif kind == "stream":
                    name = content.get("name")
                    if name in ("stdout", "stderr"):
                        emit({"type": name, "text": content.get("text", ""), "timestamp": iso(msg["header"].get("date"))})
                elif kind == "execute_result":
                    emit(result_line(content, True))
                elif kind == "display_data":
                    emit(result_line(content, self.dialect.DISPLAY_IS_MAIN_RESULT))
                elif kind == "error" and not state["errored"]:
                    state["errored"] = True
                    emit(
                        {
                            "type": "error",
                            "name": content.get("ename", ""),
                            "value": content.get("evalue", ""),
                            "traceback": "\n".join(content.get("traceback", [])),
                        }
                    )
            except ClientGone:
                if not state["interrupted"]:
                    state["interrupted"] = True
                    log.info("client left during a cell of context %s: interrupting it", self.id)
                    self.manager.interrupt_kernel()

        def forward_after_gone(msg):
            try:
                forward(msg)
            except ClientGone:
                pass

        try:
            self._drain(msg_id, lambda m: forward_after_gone(m) if state["interrupted"] else forward(m))
        except KernelDied:
            # The next cell starts a fresh kernel (see execute); there is no reply to wait for.
            self.globals_applied = False
            return
        # The shell reply of this cell: read it so the next cell's reply is not mistaken for this one.
        try:
            self._shell_reply(msg_id)
        except TimeoutError:
            pass
        if state["interrupted"]:
            raise ClientGone()


class KernelDied(Exception):
    pass


def sandbox_envs(access_token):
    """The sandbox's environment variables from envd (`envs` given at create), applied once per kernel."""
    request = urllib.request.Request(ENVD_ENVS_URL)
    if access_token:
        request.add_header("X-Access-Token", access_token)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            envs = json.loads(response.read() or b"{}")
            return {str(k): str(v) for k, v in envs.items()} if isinstance(envs, dict) else {}
    except (OSError, ValueError) as error:
        log.warning("cannot read the sandbox's env vars from envd: %s", error)
        return {}


class Contexts:
    """Every context, and the default one per language (created on first use)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}

    def create(self, language, cwd):
        kernel_for(language)
        context = Context(language, cwd)
        with self.lock:
            self.by_id[context.id] = context
        return context

    def default(self, language):
        kernel_for(language)
        with self.lock:
            context = self.defaults.get(language)
            if context is not None and context.id in self.by_id:
                return context
        context = self.create(language, DEFAULT_CWD)
        with self.lock:
            self.defaults.setdefault(language, context)
            return self.defaults[language]

    def get(self, context_id):
        with self.lock:
            context = self.by_id.get(context_id)
        if context is None:
            raise RequestError(404, f"context '{context_id}' not found")
        return context

    def remove(self, context_id):
        context = self.get(context_id)
        with self.lock:
            self.by_id.pop(context_id, None)
            for language, default in list(self.defaults.items()):
                if default.id == context_id:
                    del self.defaults[language]
        context.shutdown()

    def list(self):
        with self.lock:
            return [c.describe() for c in self.by_id.values()]


CONTEXTS = Contexts()
CONTEXT_PATH = re.compile(r"^/contexts/([^/]+)(/restart)?$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "warren-interpreter"

    def log_message(self, fmt, *args):
        log.info("%s %s", self.address_string(), fmt % args)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as error:
            raise RequestError(400, f"request body is not JSON: {error}")
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        return body

    def _send(self, status, payload=None, text=None):
        data = (json.dumps(payload) if text is None else text).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if text is None else "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _guard(self, action):
        try:
            action()
        except RequestError as error:
            self._send(error.status, text=error.message)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as error:  # a kernel that fails to start, etc.: 500 with the reason
            log.exception("request failed")
            self._send(500, text=f"{type(error).__name__}: {error}")

    def do_GET(self):
        def route():
            if self.path == "/health":
                self._send(200, "OK")
            elif self.path == "/contexts":
                self._send(200, CONTEXTS.list())
            else:
                raise RequestError(404, f"no route GET {self.path}")

        self._guard(route)

    def do_DELETE(self):
        def route():
            match = CONTEXT_PATH.match(self.path)
            if not match or match.group(2):
                raise RequestError(404, f"no route DELETE {self.path}")
            CONTEXTS.remove(match.group(1))
            self._send(204, text="")

        self._guard(route)

    def do_POST(self):
        def route():
            if self.path == "/execute":
                return self._execute(self._body())
            if self.path == "/contexts":
                body = self._body()
                cwd = body.get("cwd") or DEFAULT_CWD
                if not isinstance(cwd, str) or not cwd.startswith("/"):
                    raise RequestError(400, "cwd must be an absolute path")
                context = CONTEXTS.create(normalize_language(body.get("language")), cwd)
                return self._send(200, context.describe())
            match = CONTEXT_PATH.match(self.path)
            if match and match.group(2):
                self._body()
                CONTEXTS.get(match.group(1)).restart()
                return self._send(200, text="")
            raise RequestError(404, f"no route POST {self.path}")

        self._guard(route)

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            raise RequestError(400, "code must be a string")
        context_id, language = body.get("context_id"), body.get("language")
        if context_id and language:
            raise RequestError(400, "give context_id or language, not both")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise RequestError(400, "env_vars must be an object of strings")
        context = CONTEXTS.get(context_id) if context_id else CONTEXTS.default(normalize_language(language))

        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(line):
            data = (json.dumps(line) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError as error:
                raise ClientGone() from error

        try:
            try:
                context.execute(code, env_vars, self.headers.get("X-Access-Token"), emit)
            except (ClientGone, BrokenPipeError, ConnectionResetError):
                raise
            except Exception as error:  # the status line is sent: report the failure in the stream
                log.exception("execution failed")
                emit({"type": "error", "name": type(error).__name__, "value": str(error), "traceback": ""})
            emit({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except ClientGone:
            self.close_connection = True


def main():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    # The default Python context is started before the server listens, so a template checkpointed once
    # /health answers holds a warm kernel.
    CONTEXTS.default("python")
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True
    log.info("listening on :%d", PORT)
    server.serve_forever()


if __name__ == "__main__":
    main()
