// One sandbox: its actions, and tabs for metrics, processes, logs, events, the terminal and files.

import { json, Metric, Process, request, Sandbox } from "./api";
import { bytes, chart, h, message, stateBadge, time } from "./ui";
import { navigate, onLeave } from "./main";
import { terminalTab } from "./terminal";
import { filesTab } from "./files";

type Tab = "metrics" | "processes" | "logs" | "events" | "terminal" | "files";
const tabs: [Tab, string][] = [
  ["metrics", "Metrics"],
  ["processes", "Processes"],
  ["logs", "Logs"],
  ["events", "Events"],
  ["terminal", "Terminal"],
  ["files", "Files"],
];

export function detailPage(root: HTMLElement, id: string, initial: Tab): void {
  const summary = h("div", { class: "card", id: "sandbox-summary" }, "loading…");
  const notice = h("div", { role: "status", id: "action-status", class: "muted" });
  const tabBar = h("div", { class: "tabs", role: "tablist", "aria-label": "Sandbox views" });
  const panel = h("div", { role: "tabpanel", id: "tab-panel" });
  let stopTab: (() => void) | null = null;
  let current: Tab = initial;

  async function act(label: string, call: () => Promise<unknown>): Promise<void> {
    notice.textContent = `${label}…`;
    notice.className = "muted";
    try {
      const result = await call();
      notice.textContent = typeof result === "string" ? result : `${label}: done`;
      await loadSummary();
    } catch (error) {
      notice.textContent = `${label} failed: ${(error as Error).message}`;
      notice.className = "error";
    }
  }

  const timeoutInput = h("input", { type: "number", min: 1, value: 300, id: "timeout-seconds", style: "width:7rem" }) as HTMLInputElement;
  const forkCount = h("input", { type: "number", min: 1, max: 20, value: 1, id: "fork-count", style: "width:5rem" }) as HTMLInputElement;
  const actions = h(
    "div",
    { class: "toolbar", role: "group", "aria-label": "Actions" },
    h("label", { for: "timeout-seconds" }, "Timeout (s)"),
    timeoutInput,
    h("button", { type: "button", onclick: () => act("Set timeout", () => json("POST", `/sandboxes/${id}/timeout`, { timeout: Number(timeoutInput.value) })) }, "Set timeout"),
    h("button", { type: "button", id: "action-pause", onclick: () => act("Pause", () => json("POST", `/sandboxes/${id}/pause`)) }, "Pause"),
    h("button", { type: "button", id: "action-resume", onclick: () => act("Resume", () => json("POST", `/sandboxes/${id}/resume`, {})) }, "Resume"),
    h("label", { for: "fork-count" }, "Forks"),
    forkCount,
    h(
      "button",
      {
        type: "button",
        onclick: () =>
          act("Fork", async () => {
            const results = await json<{ sandbox?: Sandbox; error?: { message: string } }[]>("POST", `/sandboxes/${id}/fork`, { count: Number(forkCount.value) });
            const made = results.filter((r) => r.sandbox).map((r) => r.sandbox!.sandboxID);
            const failed = results.filter((r) => r.error).map((r) => r.error!.message);
            return `forked: ${made.join(", ") || "none"}${failed.length ? `; failed: ${failed.join("; ")}` : ""}`;
          }),
      },
      "Fork",
    ),
    h(
      "button",
      {
        type: "button",
        onclick: () =>
          act("Snapshot", async () => {
            const info = await json<{ snapshotID: string }>("POST", `/sandboxes/${id}/snapshots`, {});
            return `snapshot ${info.snapshotID} taken`;
          }),
      },
      "Snapshot",
    ),
    h(
      "button",
      {
        type: "button",
        class: "danger",
        onclick: () => {
          if (!window.confirm(`Kill sandbox ${id}?`)) return;
          void act("Kill", async () => {
            await request("DELETE", `/sandboxes/${id}`);
            navigate("/dashboard/sandboxes");
          });
        },
      },
      "Kill",
    ),
  );

  async function loadSummary(): Promise<void> {
    try {
      const s = await json<Sandbox & { envdVersion?: string }>("GET", `/sandboxes/${id}`);
      summary.replaceChildren(
        h("dl", { style: "display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;margin:0" },
          h("dt", {}, "State"), h("dd", { id: "sandbox-state" }, stateBadge(s.state)),
          h("dt", {}, "Template"), h("dd", {}, s.alias ?? s.templateID),
          h("dt", {}, "Started"), h("dd", {}, time(s.startedAt)),
          h("dt", {}, "Ends"), h("dd", {}, time(s.endAt)),
          h("dt", {}, "Resources"), h("dd", {}, `${s.cpuCount} vCPU, ${s.memoryMB} MiB`),
          h("dt", {}, "Metadata"), h("dd", {}, Object.entries(s.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(", ") || "none"),
        ),
      );
    } catch (error) {
      summary.replaceChildren(message(`cannot load sandbox: ${(error as Error).message}`, true));
    }
  }

  function select(tab: Tab): void {
    stopTab?.();
    stopTab = null;
    current = tab;
    history.replaceState(null, "", `/dashboard/sandboxes/${id}/${tab}`);
    tabBar.replaceChildren(
      ...tabs.map(([t, label]) =>
        h("button", { type: "button", role: "tab", id: `tab-${t}`, "aria-selected": t === current ? "true" : "false", onclick: () => select(t) }, label),
      ),
    );
    switch (tab) {
      case "metrics":
        stopTab = polled(panel, () => metricsView(id));
        break;
      case "processes":
        stopTab = polled(panel, () => processesView(id, () => void 0));
        break;
      case "logs":
        stopTab = logsTab(panel, id);
        break;
      case "events":
        stopTab = polled(panel, () => eventsView(id));
        break;
      case "terminal":
        stopTab = terminalTab(panel, id);
        break;
      case "files":
        stopTab = filesTab(panel, id);
        break;
    }
  }

  root.replaceChildren(h("h1", {}, `Sandbox ${id}`), summary, actions, notice, tabBar, panel);
  void loadSummary();
  const timer = window.setInterval(() => void loadSummary(), 3000);
  onLeave(() => {
    window.clearInterval(timer);
    stopTab?.();
  });
  select(initial);
}

/// Renders `view` into `panel` now and every two seconds; returns the stop function.
function polled(panel: HTMLElement, view: () => Promise<Node>): () => void {
  let stopped = false;
  const tick = async () => {
    try {
      const node = await view();
      if (!stopped) panel.replaceChildren(node);
    } catch (error) {
      if (!stopped) panel.replaceChildren(message((error as Error).message, true));
    }
  };
  void tick();
  const timer = window.setInterval(() => void tick(), 2000);
  return () => {
    stopped = true;
    window.clearInterval(timer);
  };
}

async function metricsView(id: string): Promise<Node> {
  const samples = await json<Metric[]>("GET", `/sandboxes/${id}/metrics`);
  if (!samples.length) return message("no metrics yet (they are sampled while the sandbox runs)");
  const memTotal = samples[samples.length - 1].memTotal;
  const diskTotal = samples[samples.length - 1].diskTotal;
  return h(
    "div",
    { class: "charts" },
    chart("CPU", samples.map((m) => m.cpuUsedPct), 100, "%"),
    chart("Memory", samples.map((m) => m.memUsed / 1048576), memTotal / 1048576, `MiB of ${Math.round(memTotal / 1048576)}`),
    chart("Disk", samples.map((m) => m.diskUsed / 1048576), diskTotal / 1048576, `MiB of ${Math.round(diskTotal / 1048576)}`),
  );
}

async function processesView(id: string, _changed: () => void): Promise<Node> {
  const list = await json<Process[]>("GET", `/sandboxes/${id}/processes`);
  list.sort((a, b) => b.cpuPercent - a.cpuPercent || b.rssBytes - a.rssBytes);
  return h(
    "table",
    { id: "process-table" },
    h("caption", { class: "sr-only" }, "Processes by CPU use"),
    h("thead", {}, h("tr", {}, ...["PID", "PPID", "User", "CPU %", "Memory", "Started", "Command", ""].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      ...list.map((p) =>
        h(
          "tr",
          {},
          h("td", {}, String(p.pid)),
          h("td", {}, String(p.ppid)),
          h("td", {}, p.user),
          h("td", {}, p.cpuPercent.toFixed(1)),
          h("td", {}, bytes(p.rssBytes)),
          h("td", {}, time(p.startedAt)),
          h("td", { title: p.command }, p.command),
          h(
            "td",
            {},
            p.pid === 1
              ? ""
              : h(
                  "button",
                  {
                    type: "button",
                    class: "danger",
                    "aria-label": `Kill process ${p.pid}`,
                    onclick: async (event: Event) => {
                      const button = event.target as HTMLButtonElement;
                      button.disabled = true;
                      try {
                        await request("DELETE", `/sandboxes/${id}/processes/${p.pid}`);
                        button.textContent = "killed";
                      } catch (error) {
                        button.textContent = (error as Error).message;
                      }
                    },
                  },
                  "Kill",
                ),
          ),
        ),
      ),
    ),
  );
}

interface LogEntry {
  timestamp: string;
  level: string;
  message: string;
}

/// Lines kept in the panel; older ones leave from the top.
const MAX_LOG_LINES = 5000;

/// The sandbox's log, live: the server pushes new lines over server-sent events (the newest 1,000
/// first). After a dropped connection the browser reconnects by itself and the server continues
/// after the last event it sent (`Last-Event-ID`).
function logsTab(panel: HTMLElement, id: string): () => void {
  const status = h("p", { role: "status", class: "muted", id: "logs-status" }, "connecting…");
  const pre = h("pre", { class: "log", id: "sandbox-logs", tabindex: 0, "aria-label": "Logs" });
  panel.replaceChildren(status, pre);
  const chunks: { node: Text; lines: number }[] = [];
  let lines = 0;
  const source = new EventSource(`/dashboard/api/sandboxes/${encodeURIComponent(id)}/logs/stream`);
  (window as unknown as { warrenLogSource: EventSource }).warrenLogSource = source;
  const live = () => `live: ${lines} line${lines === 1 ? "" : "s"}`;
  source.addEventListener("open", () => (status.textContent = live()));
  source.addEventListener("lines", (event) => {
    const entries = JSON.parse((event as MessageEvent<string>).data) as LogEntry[];
    if (entries.length) {
      const following = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
      const node = document.createTextNode(entries.map((l) => `${l.timestamp} ${l.level.padEnd(5)} ${l.message}\n`).join(""));
      pre.append(node);
      chunks.push({ node, lines: entries.length });
      lines += entries.length;
      while (lines - chunks[0].lines >= MAX_LOG_LINES) {
        const oldest = chunks.shift()!;
        oldest.node.remove();
        lines -= oldest.lines;
      }
      if (following) pre.scrollTop = pre.scrollHeight;
    }
    status.textContent = live();
  });
  source.addEventListener("end", () => {
    source.close();
    status.textContent = `${lines} lines; the sandbox has ended`;
  });
  source.addEventListener("failed", (event) => {
    source.close();
    status.textContent = JSON.parse((event as MessageEvent<string>).data) as string;
    status.className = "error";
  });
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CONNECTING) status.textContent = "reconnecting…";
    else if (source.readyState === EventSource.CLOSED && status.className !== "error") {
      status.textContent = "cannot open the log stream";
      status.className = "error";
    }
  });
  return () => source.close();
}

async function eventsView(id: string): Promise<Node> {
  const events = await json<Record<string, unknown>[]>("GET", `/events/sandboxes/${id}`);
  return h(
    "table",
    { id: "event-table" },
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Time"), h("th", { scope: "col" }, "Type"), h("th", { scope: "col" }, "Details"))),
    h(
      "tbody",
      {},
      ...events
        .slice()
        .reverse()
        .map((e) => {
          const { timestamp, type, ...rest } = e as { timestamp?: string; type?: string };
          return h("tr", {}, h("td", {}, timestamp ? time(timestamp) : ""), h("td", {}, String(type ?? "")), h("td", { class: "muted" }, JSON.stringify(rest)));
        }),
    ),
  );
}
