// The dashboard's sandbox list page against a real `warren up` with many real sandboxes, in Debian's
// headless Chromium (playwright-core): how long from navigation until the list's rows are drawn with
// every sandbox counted. Run by benches/run.py (`./warren-bench --only dashboard`), which passes:
//   WARREN_URL   the API listener
//   WARREN_KEY   an API key of the team that owns the sandboxes
//   EXPECT       how many sandboxes the list must count before it is "drawn"
//   LOADS        how many page loads to time, each in a fresh browser context (cold cache)
//   CHROMIUM     the Chromium binary
// Prints one line `RESULT {"loads": [ms, ...], "fetches": [ms, ...], "rows": n}`:
//   loads    navigation start -> the first frame painted after the rows and the "N of N" count appear
//            (performance.now() in the page, whose zero is the navigation's start);
//   fetches  the same page's API calls for the list alone (its pages of /v2/sandboxes, fetched again
//            in the page after it was drawn): the floor under the first figure;
//   rows     list rows in the DOM at the end of the first load (the list draws only those in view).
import { chromium } from "playwright-core";

const base = process.env.WARREN_URL;
const key = process.env.WARREN_KEY;
const expect = Number(process.env.EXPECT || "1000");
const loads = Number(process.env.LOADS || "5");
if (!base || !key) throw new Error("WARREN_URL and WARREN_KEY are required");
const origin = new URL(base).origin;

// Installed before the page's own scripts: notes when the list first shows `expect` sandboxes or
// more with rows drawn, then waits for the frame after that to be painted.
function watchForRows(expected) {
  const done = () => {
    const status = [...document.querySelectorAll("[role=status]")].map((n) => n.textContent ?? "").find((t) => / of \d+ sandboxes$/.test(t));
    const total = status ? Number(/ of (\d+) sandboxes$/.exec(status)[1]) : 0;
    return total >= expected && document.querySelector("#sandbox-list .row") !== null;
  };
  const observer = new MutationObserver(() => {
    if (window.listDrawnAt !== undefined || !done()) return;
    window.listDrawnAt = null;
    observer.disconnect();
    // requestAnimationFrame runs before the frame is painted; a task queued from it runs after.
    requestAnimationFrame(() => setTimeout(() => (window.listDrawnAt = performance.now()), 0));
  });
  observer.observe(document, { childList: true, subtree: true, characterData: true });
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
});
const result = { loads: [], fetches: [], rows: 0 };
try {
  for (let i = 0; i < loads; i++) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    await context.route("**/*", (route) => (new URL(route.request().url()).origin === origin ? route.continue() : route.abort()));
    const login = await context.request.post(`${base}/dashboard/api/login`, { data: { apiKey: key } });
    if (!login.ok()) throw new Error(`login answered ${login.status()}`);
    const page = await context.newPage();
    await page.addInitScript(watchForRows, expect);
    await page.goto(`${base}/dashboard/sandboxes`);
    await page.waitForFunction(() => typeof window.listDrawnAt === "number", null, { timeout: 120000 });
    result.loads.push(await page.evaluate(() => window.listDrawnAt));
    if (i === 0) result.rows = await page.locator("#sandbox-list .row").count();
    result.fetches.push(
      await page.evaluate(async () => {
        const started = performance.now();
        let token = null;
        for (let pages = 0; pages < 100; pages++) {
          const query = new URLSearchParams({ state: "running,paused", limit: "100" });
          if (token) query.set("nextToken", token);
          const response = await fetch(`/v2/sandboxes?${query}`);
          await response.json();
          token = response.headers.get("x-next-token");
          if (!token) break;
        }
        return performance.now() - started;
      }),
    );
    await context.close();
  }
} finally {
  await browser.close();
}
console.log(`RESULT ${JSON.stringify(result)}`);
