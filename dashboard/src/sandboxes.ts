// The sandboxes list: polled every two seconds, filtered and sorted in the browser, rendered as a
// windowed list (only the rows in view exist in the DOM), so a thousand sandboxes stay smooth.

import { allSandboxes, json, Metric, Sandbox } from "./api";
import { age, h, stateBadge, time } from "./ui";
import { navigate, onLeave } from "./main";

const ROW_HEIGHT = 32;
type Column = "sandboxID" | "state" | "templateID" | "age" | "endAt" | "cpu" | "memory" | "metadata";

const columns: [Column, string][] = [
  ["sandboxID", "Sandbox"],
  ["state", "State"],
  ["templateID", "Template"],
  ["age", "Age"],
  ["endAt", "Ends"],
  ["cpu", "CPU"],
  ["memory", "Memory"],
  ["metadata", "Metadata"],
];

export function sandboxesPage(root: HTMLElement): void {
  let rows: Sandbox[] = [];
  const latest = new Map<string, Metric>();
  let sortBy: Column = "age";
  let descending = false;
  let text = "";
  let stateFilter = "";
  let shown: Sandbox[] = [];

  const status = h("span", { class: "muted", role: "status" }, "loading…");
  const search = h("input", { type: "search", id: "filter-text", placeholder: "id, template, metadata" }) as HTMLInputElement;
  const stateSelect = h(
    "select",
    { id: "filter-state" },
    h("option", { value: "" }, "all states"),
    h("option", { value: "running" }, "running"),
    h("option", { value: "paused" }, "paused"),
  ) as HTMLSelectElement;
  const head = h("div", { class: "head", role: "row" });
  const viewport = h("div", { class: "viewport", role: "rowgroup", tabindex: 0, "aria-label": "sandboxes" });
  const spacer = h("div", {});
  viewport.append(spacer);
  const grid = h("div", { class: "grid", role: "table", "aria-label": "Sandboxes", id: "sandbox-list" }, head, viewport);

  function value(s: Sandbox, c: Column): string | number {
    switch (c) {
      case "age":
        return -Date.parse(s.startedAt);
      case "endAt":
        return Date.parse(s.endAt);
      case "cpu":
        return latest.get(s.sandboxID)?.cpuUsedPct ?? -1;
      case "memory":
        return latest.get(s.sandboxID)?.memUsed ?? -1;
      case "metadata":
        return JSON.stringify(s.metadata ?? {});
      default:
        return s[c] ?? "";
    }
  }

  function renderHead(): void {
    head.replaceChildren(
      ...columns.map(([c, label]) => {
        const sorted = c === sortBy;
        return h(
          "div",
          { role: "columnheader", "aria-sort": sorted ? (descending ? "descending" : "ascending") : "none" },
          h(
            "button",
            {
              type: "button",
              onclick: () => {
                if (sortBy === c) descending = !descending;
                else {
                  sortBy = c;
                  descending = false;
                }
                apply();
              },
            },
            `${label}${sorted ? (descending ? " ▼" : " ▲") : ""}`,
          ),
        );
      }),
    );
  }

  function apply(): void {
    const needle = text.toLowerCase();
    shown = rows.filter(
      (s) =>
        (!stateFilter || s.state === stateFilter) &&
        (!needle ||
          s.sandboxID.toLowerCase().includes(needle) ||
          s.templateID.toLowerCase().includes(needle) ||
          (s.alias ?? "").toLowerCase().includes(needle) ||
          Object.entries(s.metadata ?? {}).some(([k, v]) => `${k}=${v}`.toLowerCase().includes(needle))),
    );
    shown.sort((a, b) => {
      const x = value(a, sortBy);
      const y = value(b, sortBy);
      const order = x < y ? -1 : x > y ? 1 : 0;
      return descending ? -order : order;
    });
    status.textContent = `${shown.length} of ${rows.length} sandboxes`;
    spacer.style.height = `${shown.length * ROW_HEIGHT}px`;
    renderHead();
    renderRows();
  }

  function renderRows(): void {
    const first = Math.max(0, Math.floor(viewport.scrollTop / ROW_HEIGHT) - 5);
    const last = Math.min(shown.length, first + Math.ceil(viewport.clientHeight / ROW_HEIGHT) + 10);
    const fragment = document.createDocumentFragment();
    for (let i = first; i < last; i++) {
      const s = shown[i];
      const m = latest.get(s.sandboxID);
      const row = h(
        "div",
        { class: "row", role: "row", style: `top:${i * ROW_HEIGHT}px`, "data-id": s.sandboxID },
        h("div", { role: "cell" }, h("a", { href: `/dashboard/sandboxes/${s.sandboxID}`, "data-link": "1" }, s.sandboxID)),
        h("div", { role: "cell" }, stateBadge(s.state)),
        h("div", { role: "cell", title: s.templateID }, s.alias ?? s.templateID),
        h("div", { role: "cell" }, age(s.startedAt)),
        h("div", { role: "cell", title: time(s.endAt) }, time(s.endAt)),
        h("div", { role: "cell" }, m ? `${m.cpuUsedPct.toFixed(1)} % of ${s.cpuCount}` : `${s.cpuCount} vCPU`),
        h("div", { role: "cell" }, m ? `${Math.round(m.memUsed / 1048576)} / ${s.memoryMB} MiB` : `${s.memoryMB} MiB`),
        h("div", { role: "cell", class: "muted" }, Object.entries(s.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(" ")),
      );
      fragment.append(row);
    }
    viewport.replaceChildren(spacer, fragment);
  }

  async function refresh(): Promise<void> {
    try {
      rows = await allSandboxes();
      // CPU and memory of the rows in view (the API takes 100 ids a call).
      const first = Math.floor(viewport.scrollTop / ROW_HEIGHT);
      const inView = shown.slice(first, first + 60).map((s) => s.sandboxID).filter((id) => rows.some((r) => r.sandboxID === id && r.state === "running"));
      const ids = inView.length ? inView : rows.filter((r) => r.state === "running").slice(0, 60).map((r) => r.sandboxID);
      if (ids.length) {
        const metrics = await json<{ sandboxes: Record<string, Metric> }>("GET", `/sandboxes/metrics?sandbox_ids=${ids.join(",")}`);
        for (const [id, m] of Object.entries(metrics.sandboxes ?? {})) latest.set(id, m);
      }
      apply();
    } catch (error) {
      status.textContent = `cannot list sandboxes: ${(error as Error).message}`;
    }
  }

  search.addEventListener("input", () => {
    text = search.value;
    apply();
  });
  stateSelect.addEventListener("change", () => {
    stateFilter = stateSelect.value;
    apply();
  });
  viewport.addEventListener("scroll", () => requestAnimationFrame(renderRows));
  viewport.addEventListener("click", (event) => {
    const link = (event.target as HTMLElement).closest("a[data-link]") as HTMLAnchorElement | null;
    if (link) {
      event.preventDefault();
      navigate(link.getAttribute("href") ?? "/dashboard/sandboxes");
    }
  });

  root.replaceChildren(
    h("h1", {}, "Sandboxes"),
    h(
      "div",
      { class: "toolbar" },
      h("label", { for: "filter-text" }, "Filter"),
      search,
      h("label", { for: "filter-state" }, "State"),
      stateSelect,
      status,
    ),
    grid,
  );
  renderHead();
  void refresh();
  const timer = window.setInterval(() => void refresh(), 2000);
  onLeave(() => window.clearInterval(timer));
}
