"""Warren's JavaScript (and TypeScript) kernel: a Jupyter kernel (ipykernel's wrapper-kernel base, as bash_kernel is)
in front of one Node.js process running javascript_harness.js, which keeps the cells' state. The
interpreter server talks to it like any other kernel; an interrupt (SIGINT to this process) is passed
on to Node, which breaks the running cell; a Node process that dies is started again, its state gone,
and the cell says so. With WARREN_KERNEL_LANGUAGE=typescript (the TypeScript kernelspec sets it) the
harness transpiles each cell from TypeScript first."""

import json
import os
import signal
import subprocess
import sys
import threading

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "javascript_harness.js")
# How long Node may take to break a cell after SIGINT before it is killed and started again.
INTERRUPT_GRACE_S = 3.0


def node_version():
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.strip().lstrip("v") or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Node:
    """The Node.js process and the channel (its fd 3) it answers on."""

    def __init__(self):
        read_end, write_end = os.pipe()
        self.process = subprocess.Popen(
            ["node", HARNESS],
            stdin=subprocess.PIPE,
            pass_fds=(write_end,),
            env={**os.environ, "WARREN_CHANNEL_FD": str(write_end)},
            # A process group of its own: the interpreter server interrupts this kernel's group, and
            # Node must get exactly one SIGINT per interrupt, the one passed on below (a second one
            # could break the next cell).
            process_group=0,
            text=True,
        )
        os.close(write_end)
        self.messages = os.fdopen(read_end, "r", encoding="utf-8", errors="replace")
        self.interrupt_timer = None

    def send(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def read(self):
        """The next message; None when Node has gone."""
        line = self.messages.readline()
        if not line:
            return None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return {"type": "stream", "name": "stderr", "text": line}

    def stop(self):
        if self.interrupt_timer is not None:
            self.interrupt_timer.cancel()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.messages.close()


TYPESCRIPT = os.environ.get("WARREN_KERNEL_LANGUAGE") == "typescript"


class JavaScriptKernel(Kernel):
    implementation = "warren-javascript"
    implementation_version = "1.0"
    language = "typescript" if TYPESCRIPT else "javascript"
    language_version = node_version()
    language_info = {
        "name": language,
        "version": language_version,
        "mimetype": "text/typescript" if TYPESCRIPT else "application/javascript",
        "file_extension": ".ts" if TYPESCRIPT else ".js",
    }
    banner = f"Node.js {language_version} (Warren's {language} kernel)"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.node = Node()

    def _restart_node(self):
        self.node.stop()
        self.node = Node()

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False):
        # ipykernel counts executions itself (not for silent ones).
        count = self.execution_count
        try:
            self.node.send({"code": code, "silent": silent})
        except (BrokenPipeError, OSError):
            self._restart_node()
            return self._failed(silent, "KernelRestarted", "Node.js had exited; it was started again, its state is gone")
        reply = {"status": "ok", "execution_count": count, "payload": [], "user_expressions": {}}
        while True:
            try:
                message = self.node.read()
            except KeyboardInterrupt:
                # The server interrupts by SIGINT to this process: Node breaks the cell itself.
                self._interrupt()
                continue
            if message is None:
                self._restart_node()
                return self._failed(silent, "KernelRestarted", "Node.js exited during the cell; it was started again, its state is gone")
            kind = message.get("type")
            if kind == "done":
                if self.node.interrupt_timer is not None:
                    self.node.interrupt_timer.cancel()
                    self.node.interrupt_timer = None
                return reply
            if kind == "stream" and not silent:
                self.send_response(self.iopub_socket, "stream", {"name": message["name"], "text": message["text"]})
            elif kind == "result" and not silent:
                self.send_response(
                    self.iopub_socket,
                    "execute_result",
                    {"execution_count": count, "data": {"text/plain": message["text"]}, "metadata": {}},
                )
            elif kind == "error":
                content = {
                    "ename": message.get("name", "Error"),
                    "evalue": message.get("value", ""),
                    "traceback": message.get("traceback", []),
                }
                # Published even for a silent cell: the server's bookkeeping cells (env vars, cwd)
                # learn from it that they failed.
                self.send_response(self.iopub_socket, "error", content)
                reply = {"status": "error", "execution_count": count, **content}

    def _interrupt(self):
        """Passes an interrupt on to Node; kills it (and so restarts it) when it does not break the
        cell in time."""
        node = self.node
        node.process.send_signal(signal.SIGINT)
        if node.interrupt_timer is None:
            node.interrupt_timer = threading.Timer(INTERRUPT_GRACE_S, node.process.kill)
            node.interrupt_timer.daemon = True
            node.interrupt_timer.start()

    def _failed(self, silent, name, value):
        content = {"ename": name, "evalue": value, "traceback": [f"{name}: {value}"]}
        self.send_response(self.iopub_socket, "error", content)
        return {"status": "error", "execution_count": self.execution_count, **content}

    def do_shutdown(self, restart):
        self.node.stop()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    sys.argv[0] = "javascript_kernel"
    IPKernelApp.launch_instance(kernel_class=JavaScriptKernel)
