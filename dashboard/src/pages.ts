// Templates (with a build's log streamed while it runs), snapshots and the fleet view.

import { json, Sandbox, allSandboxes } from "./api";
import { h, message, percentile, stateBadge, time, timeSeries } from "./ui";
import { navigate, onLeave } from "./main";

interface Template {
  templateID: string;
  buildID: string;
  aliases: string[];
  names?: string[];
  cpuCount: number;
  memoryMB: number;
  public: boolean;
  buildStatus: string;
  createdAt: string;
  spawnCount: number;
  buildCount: number;
}

interface Build {
  buildID: string;
  status: string;
  createdAt: string;
  finishedAt?: string;
}

export async function templatesPage(root: HTMLElement): Promise<void> {
  root.replaceChildren(h("h1", {}, "Templates"), message("loading…"));
  const logPanel = h("div", { id: "build-panel" });
  let stopLog: (() => void) | null = null;
  onLeave(() => stopLog?.());
  try {
    const templates = await json<Template[]>("GET", "/templates");
    const table = h(
      "table",
      { id: "template-table" },
      h("thead", {}, h("tr", {}, ...["Template", "Aliases", "Status", "Resources", "Builds", "Spawns", "Created", ""].map((c) => h("th", { scope: "col" }, c)))),
      h(
        "tbody",
        {},
        ...templates.map((t) =>
          h(
            "tr",
            {},
            h("td", {}, t.templateID),
            h("td", {}, (t.aliases ?? []).join(", ")),
            h("td", {}, t.buildStatus),
            h("td", {}, `${t.cpuCount} vCPU, ${t.memoryMB} MiB`),
            h("td", {}, String(t.buildCount)),
            h("td", {}, String(t.spawnCount)),
            h("td", {}, time(t.createdAt)),
            h("td", {}, h("button", { type: "button", onclick: () => void showBuilds(t) }, "Builds")),
          ),
        ),
      ),
    );
    root.replaceChildren(h("h1", {}, "Templates"), templates.length ? table : message("no templates"), logPanel);
  } catch (error) {
    root.replaceChildren(h("h1", {}, "Templates"), message((error as Error).message, true));
  }

  async function showBuilds(t: Template): Promise<void> {
    stopLog?.();
    const detail = await json<{ builds: Build[] }>("GET", `/templates/${t.templateID}`);
    const builds = (detail.builds ?? []).slice().sort((a, b) => Date.parse(b.createdAt) - Date.parse(a.createdAt));
    const log = h("pre", { class: "log", id: "build-log", tabindex: 0, "aria-label": "Build log" });
    logPanel.replaceChildren(
      h("h2", {}, `Builds of ${t.aliases?.[0] ?? t.templateID}`),
      h(
        "ul",
        {},
        ...builds.map((b) =>
          h("li", {}, h("button", { type: "button", onclick: () => (stopLog = streamLog(t.templateID, b.buildID, log)) }, `${b.buildID} (${b.status}, ${time(b.createdAt)})`)),
        ),
      ),
      log,
    );
    if (builds.length) stopLog = streamLog(t.templateID, builds[0].buildID, log);
  }
}

/// Polls a build's status from the last log line read, appending new lines until the build ends.
export function streamLog(templateId: string, buildId: string, into: HTMLElement): () => void {
  let offset = 0;
  let lastStep = "";
  let stopped = false;
  into.textContent = "";
  const status = h("p", { role: "status", class: "muted", id: "build-status" });
  into.before(status);
  const tick = async () => {
    if (stopped) return;
    try {
      const info = await json<{ status: string; logEntries: { level: string; message: string; step?: string }[] }>(
        "GET",
        `/templates/${templateId}/builds/${buildId}/status?logsOffset=${offset}`,
      );
      if (stopped) return;
      const entries = info.logEntries ?? [];
      if (entries.length) {
        into.append(entries.map((e) => `${e.step ? `[${e.step}] ` : ""}${e.level === "info" ? "" : `${e.level}: `}${e.message}`).join("\n") + "\n");
        offset += entries.length;
        into.scrollTop = into.scrollHeight;
        const step = [...entries].reverse().find((e) => e.step)?.step;
        if (step) lastStep = step;
      }
      status.textContent = `build ${buildId}: ${info.status} (${offset} log lines${lastStep ? `, step ${lastStep}` : ""})`;
      if (info.status === "building" || info.status === "waiting") window.setTimeout(tick, 1000);
    } catch (error) {
      status.textContent = `cannot read the build: ${(error as Error).message}`;
    }
  };
  void tick();
  return () => {
    stopped = true;
    status.remove();
  };
}

interface Snapshot {
  snapshotID: string;
  names: string[];
  sandboxID?: string;
  sizeBytes?: number;
  createdAt?: string;
}

export async function snapshotsPage(root: HTMLElement): Promise<void> {
  root.replaceChildren(h("h1", {}, "Snapshots"), message("loading…"));
  try {
    const snapshots = await json<Snapshot[]>("GET", "/snapshots");
    root.replaceChildren(
      h("h1", {}, "Snapshots"),
      snapshots.length
        ? h(
            "table",
            { id: "snapshot-table" },
            h("thead", {}, h("tr", {}, ...["Snapshot", "Names", "From sandbox", "Size", "Created"].map((c) => h("th", { scope: "col" }, c)))),
            h(
              "tbody",
              {},
              ...snapshots.map((s) =>
                h(
                  "tr",
                  {},
                  h("td", {}, s.snapshotID),
                  h("td", {}, s.names.join(", ")),
                  h("td", {}, s.sandboxID ?? ""),
                  h("td", {}, s.sizeBytes !== undefined ? `${(s.sizeBytes / 1048576).toFixed(1)} MiB` : ""),
                  h("td", {}, s.createdAt ? time(s.createdAt) : ""),
                ),
              ),
            ),
          )
        : message("no snapshots"),
    );
  } catch (error) {
    root.replaceChildren(h("h1", {}, "Snapshots"), message((error as Error).message, true));
  }
}

interface TimedOperation {
  at: string;
  operation: "create" | "resume" | "pause";
  sandboxID: string;
  ms: number;
}

interface PolicyNote {
  timestamp: string;
  policy: string;
  sandboxID: string;
  templateID?: string;
  message: string;
}

const operationColors: [TimedOperation["operation"], string][] = [
  ["create", "#1f6feb"],
  ["resume", "#2e7d32"],
  ["pause", "#b26a00"],
];

/// How long creates, resumes and pauses took over the last hour: a chart and a table of percentiles.
function latencyView(latency: { since: string; operations: TimedOperation[] }): HTMLElement {
  // The chart starts shortly before the hour's first operation, so a quiet hour does not squeeze
  // the points against its right edge.
  const now = Date.now();
  const first = Math.min(now, ...latency.operations.map((o) => Date.parse(o.at)));
  const from = Math.max(Date.parse(latency.since), first - Math.max(10000, (now - first) / 20));
  const series = operationColors.map(([name, color]) => ({
    name,
    color,
    points: latency.operations.filter((o) => o.operation === name).map((o) => [Date.parse(o.at), o.ms] as [number, number]),
  }));
  const ms = (v: number) => (Number.isNaN(v) ? "–" : `${Math.round(v)} ms`);
  return h(
    "div",
    { id: "latency" },
    timeSeries("Create, resume and pause latency, last hour", series, from, now, "ms", "latency-chart"),
    h(
      "table",
      { id: "latency-table" },
      h("caption", { class: "sr-only" }, "Latency by operation, last hour"),
      h("thead", {}, h("tr", {}, ...["Operation", "Count", "p50", "p95", "Max"].map((c) => h("th", { scope: "col" }, c)))),
      h(
        "tbody",
        {},
        ...series.map((s) => {
          const values = s.points.map(([, v]) => v);
          return h(
            "tr",
            { "data-operation": s.name },
            h("th", { scope: "row" }, s.name),
            h("td", {}, String(values.length)),
            h("td", {}, ms(percentile(values, 50))),
            h("td", {}, ms(percentile(values, 95))),
            h("td", {}, ms(values.length ? Math.max(...values) : NaN)),
          );
        }),
      ),
    ),
  );
}

/// The notes of the fleet-hygiene checks, newest first.
function policyView(notes: PolicyNote[]): HTMLElement {
  if (!notes.length) {
    return h("p", { class: "muted", id: "policy-events-empty" }, "No policy events: no runaway process, OOM kill, memory pressure, nearly full disk, orphans reaped or reconciler fix recorded.");
  }
  return h(
    "table",
    { id: "policy-events" },
    h("thead", {}, h("tr", {}, ...["Time", "Policy", "Sandbox", "What"].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      ...notes.map((n) =>
        h(
          "tr",
          { "data-policy": n.policy },
          h("td", {}, time(n.timestamp)),
          h("td", {}, n.policy),
          h("td", {}, h("a", { href: `/dashboard/sandboxes/${n.sandboxID}/events`, "data-link": "1" }, n.sandboxID)),
          h("td", { class: "wrap" }, n.message),
        ),
      ),
    ),
  );
}

export function fleetPage(root: HTMLElement): void {
  const body = h("div", {});
  root.replaceChildren(h("h1", {}, "Fleet"), body);
  body.addEventListener("click", (event) => {
    const link = (event.target as HTMLElement).closest("a[data-link]") as HTMLAnchorElement | null;
    if (link) {
      event.preventDefault();
      navigate(link.getAttribute("href") ?? "/dashboard/fleet");
    }
  });
  const render = async () => {
    try {
      const [health, sandboxes, latency, notes] = await Promise.all([
        json<Record<string, unknown>>("GET", "/health"),
        allSandboxes(),
        json<{ since: string; operations: TimedOperation[] }>("GET", "/dashboard/api/fleet/latency?minutes=60"),
        json<PolicyNote[]>("GET", "/dashboard/api/fleet/policy-events?limit=100"),
      ]);
      const counts = new Map<string, number>();
      for (const s of sandboxes) counts.set(s.state, (counts.get(s.state) ?? 0) + 1);
      const running = sandboxes.filter((s: Sandbox) => s.state === "running");
      const vcpus = running.reduce((n, s) => n + s.cpuCount, 0);
      const memory = running.reduce((n, s) => n + s.memoryMB, 0);
      const stat = (label: string, value: string | Node, id: string) => h("div", { class: "stat", id }, h("div", { class: "n" }, value), h("div", { class: "muted" }, label));
      body.replaceChildren(
        h(
          "div",
          { class: "stats" },
          stat("running", String(counts.get("running") ?? 0), "count-running"),
          stat("paused", String(counts.get("paused") ?? 0), "count-paused"),
          stat("vCPUs reserved by running sandboxes", String(vcpus), "reserved-cpu"),
          stat("MiB reserved by running sandboxes", String(memory), "reserved-memory"),
        ),
        h("h2", {}, "Latency"),
        latencyView(latency),
        h("h2", {}, "Policy events"),
        policyView(notes),
        h("h2", {}, "Node"),
        h(
          "table",
          { id: "health-table" },
          h("tbody", {}, ...Object.entries(health).map(([k, v]) => h("tr", {}, h("th", { scope: "row" }, k), h("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v))))),
        ),
        h("h2", {}, "Sandboxes by template"),
        h(
          "table",
          {},
          h("tbody", {}, ...[...groupBy(sandboxes, (s) => s.alias ?? s.templateID)].map(([t, list]) => h("tr", {}, h("th", { scope: "row" }, t), h("td", {}, ...list.slice(0, 3).map((s) => stateBadge(s.state))), h("td", {}, `${list.length} sandboxes`)))),
        ),
      );
    } catch (error) {
      body.replaceChildren(message((error as Error).message, true));
    }
  };
  void render();
  const timer = window.setInterval(() => void render(), 3000);
  onLeave(() => window.clearInterval(timer));
}

function groupBy<T>(items: T[], key: (item: T) => string): Map<string, T[]> {
  const map = new Map<string, T[]>();
  for (const item of items) {
    const k = key(item);
    map.set(k, [...(map.get(k) ?? []), item]);
  }
  return map;
}

interface ApiKey {
  id: string;
  name: string;
  teamID: string;
  admin: boolean;
  mask: { prefix: string; maskedValuePrefix: string };
  createdAt: string;
  lastUsed?: string;
  key?: string;
}

/// API keys: listed, made and revoked with an admin key (the API answers 403 to other keys).
export function keysPage(root: HTMLElement): void {
  const body = h("div", {});
  const name = h("input", { type: "text", id: "key-name", required: true }) as HTMLInputElement;
  const team = h("input", { type: "text", id: "key-team", placeholder: "this key's team" }) as HTMLInputElement;
  const made = h("p", { role: "status", id: "key-made" });
  const render = async () => {
    try {
      const keys = await json<ApiKey[]>("GET", "/api-keys");
      body.replaceChildren(
        h(
          "table",
          { id: "key-table" },
          h("thead", {}, h("tr", {}, ...["Name", "Key", "Team", "Admin", "Created", "Last used", ""].map((c) => h("th", { scope: "col" }, c)))),
          h(
            "tbody",
            {},
            ...keys.map((k) =>
              h(
                "tr",
                {},
                h("td", {}, k.name),
                // The masked prefix already starts with the key prefix (`e2b_`).
                h("td", {}, `${k.mask?.maskedValuePrefix ?? ""}…`),
                h("td", {}, k.teamID),
                h("td", {}, k.admin ? "yes" : ""),
                h("td", {}, time(k.createdAt)),
                h("td", {}, k.lastUsed ? time(k.lastUsed) : ""),
                h(
                  "td",
                  {},
                  h(
                    "button",
                    {
                      type: "button",
                      class: "danger",
                      "aria-label": `Revoke key ${k.name}`,
                      onclick: async () => {
                        if (!window.confirm(`Revoke API key ${k.name}? Its sessions end too.`)) return;
                        try {
                          await json("DELETE", `/api-keys/${encodeURIComponent(k.id)}`);
                        } catch (error) {
                          made.textContent = `cannot revoke: ${(error as Error).message}`;
                        }
                        await render();
                      },
                    },
                    "Revoke",
                  ),
                ),
              ),
            ),
          ),
        ),
      );
    } catch (error) {
      body.replaceChildren(message((error as Error).message, true));
    }
  };
  const form = h(
    "form",
    {
      class: "toolbar",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        try {
          const key = await json<ApiKey>("POST", "/api-keys", { name: name.value, ...(team.value ? { teamID: team.value } : {}) });
          made.textContent = `new key ${key.name}: ${key.key} (shown once)`;
          name.value = "";
          await render();
        } catch (error) {
          made.textContent = `cannot make the key: ${(error as Error).message}`;
        }
      },
    },
    h("label", { for: "key-name" }, "New key name"),
    name,
    h("label", { for: "key-team" }, "Team"),
    team,
    h("button", { type: "submit" }, "Create key"),
  );
  root.replaceChildren(h("h1", {}, "API keys"), form, made, body);
  void render();
}
