"""PTY sessions (real pseudo-terminals) through the official SDK."""

import threading

from e2b import PtySize

from conftest import wait_until


class Screen:
    def __init__(self, handle):
        self.data = b""
        self.lock = threading.Lock()
        self.result = None
        self.thread = threading.Thread(target=self._pump, args=(handle,), daemon=True)
        self.thread.start()

    def _pump(self, handle):
        def on_pty(chunk):
            with self.lock:
                self.data += chunk
        try:
            self.result = handle.wait(on_pty=on_pty)
        except Exception as e:  # the exit code of a killed shell raises
            self.result = e

    def text(self):
        with self.lock:
            return self.data.decode("utf-8", "replace")


def test_pty_is_a_real_terminal_with_resize_and_kill(sbx):
    handle = sbx.pty.create(PtySize(rows=24, cols=80))
    screen = Screen(handle)
    sbx.pty.send_stdin(handle.pid, b"tty; stty size; echo TERM=$TERM\n")
    wait_until(lambda: "24 80" in screen.text() and "TERM=xterm-256color" in screen.text(), "pty output")
    assert "/dev/pts/" in screen.text()
    sbx.pty.resize(handle.pid, PtySize(rows=50, cols=132))
    sbx.pty.send_stdin(handle.pid, b"stty size\n")
    wait_until(lambda: "50 132" in screen.text(), "resized pty")
    assert sbx.pty.kill(handle.pid) is True
    screen.thread.join(30)
    assert not screen.thread.is_alive()


def test_pty_exit_ends_the_session(sbx):
    handle = sbx.pty.create(PtySize(rows=10, cols=40))
    screen = Screen(handle)
    sbx.pty.send_stdin(handle.pid, b"exit 0\n")
    screen.thread.join(30)
    assert not screen.thread.is_alive()
    assert getattr(screen.result, "exit_code", None) == 0
