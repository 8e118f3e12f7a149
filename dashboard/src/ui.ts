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

export interface Series {
  name: string;
  color: string;
  /// [unix ms, value], any order.
  points: [number, number][];
}

/// A time-series chart as inline SVG: each series' points over the window `from`..`to` (unix ms),
/// dots joined in time order, with the largest value and both ends of the window labelled.
export function timeSeries(title: string, series: Series[], from: number, to: number, unit: string, id: string): HTMLElement {
  const width = 1000;
  const height = 180;
  const pad = { left: 48, right: 8, top: 8, bottom: 20 };
  const svgNs = "http://www.w3.org/2000/svg";
  const el = <K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>, text?: string) => {
    const node = document.createElementNS(svgNs, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const top = Math.max(1, ...series.flatMap((s) => s.points.map(([, v]) => v)));
  const x = (t: number) => pad.left + ((t - from) / Math.max(1, to - from)) * (width - pad.left - pad.right);
  const y = (v: number) => height - pad.bottom - (Math.min(v, top) / top) * (height - pad.top - pad.bottom);
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", id });
  const counts = series.map((s) => `${s.name} ${s.points.length}`).join(", ");
  svg.setAttribute("aria-label", `${title}: ${counts} in the window, largest ${Math.round(top)} ${unit}`);
  svg.append(
    el("line", { x1: pad.left, y1: pad.top, x2: pad.left, y2: height - pad.bottom, stroke: "#c5ccd6" }),
    el("line", { x1: pad.left, y1: height - pad.bottom, x2: width - pad.right, y2: height - pad.bottom, stroke: "#c5ccd6" }),
    el("text", { x: pad.left - 4, y: pad.top + 8, "text-anchor": "end", "font-size": 10, fill: "#5b6573" }, `${Math.round(top)} ${unit}`),
    el("text", { x: pad.left - 4, y: height - pad.bottom, "text-anchor": "end", "font-size": 10, fill: "#5b6573" }, "0"),
    el("text", { x: pad.left, y: height - 4, "font-size": 10, fill: "#5b6573" }, new Date(from).toLocaleTimeString()),
    el("text", { x: width - pad.right, y: height - 4, "text-anchor": "end", "font-size": 10, fill: "#5b6573" }, new Date(to).toLocaleTimeString()),
  );
  for (const s of series) {
    const points = s.points.slice().sort((a, b) => a[0] - b[0]);
    const group = el("g", { "data-series": s.name });
    if (points.length > 1) {
      group.append(el("polyline", { points: points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "), fill: "none", stroke: s.color, "stroke-width": 1, "stroke-opacity": 0.5 }));
    }
    for (const [t, v] of points) group.append(el("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, fill: s.color }));
    svg.append(group);
  }
  const legend = h("div", { class: "legend" }, ...series.map((s) => h("span", {}, h("span", { class: "swatch", style: `background:${s.color}` }), ` ${s.name} (${s.points.length})`)));
  return h("figure", { class: "chart card wide" }, h("figcaption", {}, title), svg as unknown as Node, legend);
}

/// The `q`th percentile (0..100) of `values` (nearest rank); NaN when empty.
export function percentile(values: number[], q: number): number {
  if (!values.length) return NaN;
  const sorted = values.slice().sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((q / 100) * sorted.length) - 1))];
}
