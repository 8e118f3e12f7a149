// Small DOM helpers: elements are built with text nodes, never from untrusted HTML.

type Child = Node | string | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | boolean | number | ((e: Event) => void)> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (typeof value === "function") el.addEventListener(name.replace(/^on/, ""), value as EventListener);
    else if (value === false) continue;
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child);
  }
  return el;
}

export function age(iso: string): string {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
  return `${Math.floor(seconds / 86400)}d`;
}

export function time(iso: string): string {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}

export function stateBadge(state: string): HTMLElement {
  const cls = state === "running" || state === "paused" ? state : "other";
  return h("span", { class: `state ${cls}` }, state);
}

export function message(text: string, isError = false): HTMLElement {
  return h("p", { class: isError ? "error" : "muted", role: isError ? "alert" : "status" }, text);
}

/// A line chart of `values` (0..max) as inline SVG.
export function chart(title: string, values: number[], max: number, unit: string): HTMLElement {
  const width = 300;
  const height = 100;
  const svgNs = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNs, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const last = values.length ? values[values.length - 1] : 0;
  svg.setAttribute("aria-label", `${title}: latest ${last.toFixed(1)} ${unit}`);
  const top = max > 0 ? max : Math.max(1, ...values);
  if (values.length > 1) {
    const points = values
      .map((v, i) => `${((i / (values.length - 1)) * width).toFixed(1)},${(height - (Math.min(v, top) / top) * (height - 4) - 2).toFixed(1)}`)
      .join(" ");
    const line = document.createElementNS(svgNs, "polyline");
    line.setAttribute("points", points);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#1f6feb");
    line.setAttribute("stroke-width", "2");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
  }
  return h("figure", { class: "chart card" }, h("figcaption", {}, `${title}: ${last.toFixed(1)} ${unit}`), svg as unknown as Node);
}
