// Warren's dashboard: a single-page app under /dashboard, signed in with a session cookie that the
// server set at login. Routes: /dashboard/login, /dashboard/sandboxes[/<id>[/<tab>]],
// /dashboard/templates, /dashboard/snapshots, /dashboard/fleet, /dashboard/keys.

import "./style.css";
import { HttpError, json, request, Session, setCsrf } from "./api";
import { h, message } from "./ui";
import { sandboxesPage } from "./sandboxes";
import { detailPage } from "./detail";
import { fleetPage, keysPage, snapshotsPage, templatesPage } from "./pages";

const app = document.getElementById("app") as HTMLElement;
let leaving: (() => void)[] = [];
let session: Session | null = null;

/// Runs `fn` when the current page is replaced (stops its timers and sockets).
export function onLeave(fn: () => void): void {
  leaving.push(fn);
}

export function navigate(path: string): void {
  history.pushState(null, "", path);
  void route();
}

function nav(): HTMLElement {
  const here = location.pathname;
  const link = (path: string, label: string) =>
    h("a", { href: path, "data-link": "1", "aria-current": here.startsWith(path) ? "page" : false }, label);
  return h(
    "header",
    { class: "top" },
    h("strong", {}, "Warren"),
    h("nav", { "aria-label": "Main" }, link("/dashboard/sandboxes", "Sandboxes"), link("/dashboard/templates", "Templates"), link("/dashboard/snapshots", "Snapshots"), link("/dashboard/fleet", "Fleet"), link("/dashboard/keys", "API keys")),
    h("span", { class: "spacer" }),
    h("span", { id: "team" }, session ? `team ${session.teamId} · key ${session.keyName}` : ""),
    h(
      "button",
      {
        type: "button",
        id: "logout",
        onclick: async () => {
          try {
            await request("POST", "/dashboard/api/logout");
          } finally {
            session = null;
            navigate("/dashboard/login");
          }
        },
      },
      "Log out",
    ),
  );
}

function loginPage(): void {
  const input = h("input", { type: "password", id: "api-key", name: "apiKey", autocomplete: "off", required: true }) as HTMLInputElement;
  const error = h("p", { role: "alert", class: "error", id: "login-error" });
  const form = h(
    "form",
    {
      class: "card login",
      "aria-labelledby": "login-title",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        error.textContent = "";
        try {
          session = await json<Session>("POST", "/dashboard/api/login", { apiKey: input.value });
          setCsrf(session.csrfToken);
          navigate("/dashboard/sandboxes");
        } catch (e) {
          error.textContent = e instanceof HttpError && e.status === 401 ? "That API key is not valid." : `Cannot log in: ${(e as Error).message}`;
        }
      },
    },
    h("h1", { id: "login-title" }, "Warren dashboard"),
    h("label", { for: "api-key" }, "API key"),
    input,
    h("button", { type: "submit", class: "primary" }, "Log in"),
    error,
  );
  app.replaceChildren(form);
  input.focus();
}

async function route(): Promise<void> {
  for (const fn of leaving) fn();
  leaving = [];
  const path = location.pathname.replace(/\/+$/, "");
  if (path === "/dashboard/login") {
    loginPage();
    return;
  }
  if (!session) {
    try {
      session = await json<Session>("GET", "/dashboard/api/session");
      setCsrf(session.csrfToken);
    } catch {
      return; // the 401 handler has sent the browser to the login page
    }
  }
  const main = h("main", {});
  app.replaceChildren(nav(), main);
  const parts = path.split("/").slice(2); // after "/dashboard"
  if (parts[0] === "sandboxes" && parts[1]) {
    const tab = (parts[2] ?? "metrics") as Parameters<typeof detailPage>[2];
    detailPage(main, parts[1], tab);
  } else if (parts[0] === "templates") {
    void templatesPage(main);
  } else if (parts[0] === "snapshots") {
    void snapshotsPage(main);
  } else if (parts[0] === "fleet") {
    fleetPage(main);
  } else if (parts[0] === "keys") {
    keysPage(main);
  } else if (!parts[0] || parts[0] === "sandboxes") {
    history.replaceState(null, "", "/dashboard/sandboxes");
    sandboxesPage(main);
  } else {
    main.replaceChildren(message(`no page ${path}`, true));
  }
}

document.addEventListener("click", (event) => {
  const link = (event.target as HTMLElement).closest("header a[data-link]") as HTMLAnchorElement | null;
  if (link && !event.ctrlKey && !event.metaKey) {
    event.preventDefault();
    navigate(link.getAttribute("href") ?? "/dashboard/sandboxes");
  }
});
window.addEventListener("popstate", () => void route());
void route();
