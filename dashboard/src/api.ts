// The REST API as the dashboard calls it: same origin, the session cookie as credential, the session's
// CSRF token on every state-changing request.

let csrfToken = "";

export function setCsrf(token: string): void {
  csrfToken = token;
}

export function csrf(): string {
  return csrfToken;
}

export class HttpError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
}

async function failure(response: Response): Promise<HttpError> {
  let message = response.statusText;
  try {
    const body = await response.json();
    if (body && typeof body.message === "string") message = body.message;
  } catch {
    // not JSON: keep the status text
  }
  return new HttpError(response.status, message);
}

export async function request(method: string, path: string, body?: unknown, raw?: BodyInit): Promise<Response> {
  const headers: Record<string, string> = {};
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = csrfToken;
  let payload: BodyInit | undefined = raw;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers, body: payload, credentials: "same-origin" });
  if (response.status === 401 && !path.startsWith("/dashboard/api/login")) {
    window.location.assign("/dashboard/login");
  }
  if (!response.ok) throw await failure(response);
  return response;
}

export async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await request(method, path, body);
  if (response.status === 204) return undefined as T;
  const text = await response.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

export interface Sandbox {
  sandboxID: string;
  templateID: string;
  alias?: string;
  startedAt: string;
  endAt: string;
  cpuCount: number;
  memoryMB: number;
  state: string;
  metadata: Record<string, string>;
}

export interface Metric {
  timestampUnix: number;
  cpuCount: number;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
  diskUsed: number;
  diskTotal: number;
}

export interface Process {
  pid: number;
  ppid: number;
  user: string;
  command: string;
  cpuPercent: number;
  rssBytes: number;
  startedAt: string;
}

export interface Session {
  teamId: string;
  keyName: string;
  csrfToken: string;
}

/// Every sandbox of the team (running and paused), following the API's pages.
export async function allSandboxes(): Promise<Sandbox[]> {
  const all: Sandbox[] = [];
  let token: string | null = null;
  for (let page = 0; page < 100; page++) {
    const query = new URLSearchParams({ state: "running,paused", limit: "100" });
    if (token) query.set("nextToken", token);
    const response = await request("GET", `/v2/sandboxes?${query}`);
    all.push(...((await response.json()) as Sandbox[]));
    token = response.headers.get("x-next-token");
    if (!token) break;
  }
  return all;
}
