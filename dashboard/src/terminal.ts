// The terminal tab: xterm.js over a WebSocket that the server bridges to a shell on a PTY in the
// sandbox. After a dropped connection it reconnects to the same shell (`?pid=`).

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import { csrf } from "./api";
import { h } from "./ui";

declare global {
  interface Window {
    /// The open terminal, for the browser tests (they read its buffer).
    warrenTerminal?: Terminal;
    /// Its current WebSocket (the tests close it to play a dropped connection).
    warrenTerminalSocket?: WebSocket;
  }
}

export function terminalTab(root: HTMLElement, sandboxId: string): () => void {
  const status = h("span", { class: "muted", role: "status", id: "terminal-status" }, "connecting…");
  const box = h("div", { id: "terminal", "aria-label": "Terminal" });
  const end = h("button", { type: "button", class: "danger" }, "End shell");
  root.replaceChildren(h("div", { class: "toolbar" }, status, end), box);

  const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000, convertEol: false });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  term.focus();
  window.warrenTerminal = term;

  const encoder = new TextEncoder();
  let socket: WebSocket | null = null;
  let pid: number | null = null;
  let closed = false;
  let retry = 0;

  function connect(): void {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = new URLSearchParams({ csrf: csrf(), cols: String(term.cols), rows: String(term.rows) });
    if (pid !== null) query.set("pid", String(pid));
    const ws = new WebSocket(`${scheme}://${location.host}/dashboard/api/sandboxes/${sandboxId}/terminal?${query}`);
    ws.binaryType = "arraybuffer";
    socket = ws;
    window.warrenTerminalSocket = ws;
    ws.onmessage = (event) => {
      if (typeof event.data === "string") {
        const msg = JSON.parse(event.data);
        if (msg.type === "started") {
          pid = msg.pid;
          retry = 0;
          status.textContent = `shell pid ${pid}`;
        } else if (msg.type === "exited") {
          status.textContent = `shell exited (${msg.code ?? "?"})`;
          closed = true;
          pid = null;
        } else if (msg.type === "error") {
          status.textContent = `terminal error: ${msg.message}`;
          // A shell that is gone cannot be reattached: start a new one next time.
          pid = null;
        }
      } else {
        term.write(new Uint8Array(event.data as ArrayBuffer));
      }
    };
    ws.onclose = () => {
      if (closed) return;
      retry += 1;
      status.textContent = `connection lost; reconnecting (attempt ${retry})…`;
      window.setTimeout(connect, Math.min(5000, 250 * 2 ** retry));
    };
  }

  term.onData((data) => {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
  });
  term.onResize(({ cols, rows }) => {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "resize", cols, rows }));
  });
  const onWindowResize = () => fit.fit();
  window.addEventListener("resize", onWindowResize);
  end.addEventListener("click", () => {
    closed = true;
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "close" }));
    status.textContent = "shell ended";
  });
  connect();

  return () => {
    // Leaving the tab detaches; the shell stays for a later reconnect only while the page lives.
    closed = true;
    window.removeEventListener("resize", onWindowResize);
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "close" }));
    socket?.close();
    term.dispose();
    if (window.warrenTerminal === term) window.warrenTerminal = undefined;
  };
}
