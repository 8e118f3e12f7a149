// Drives Debian's Chromium (headless, through playwright-core) against a real `warren up`.
// Run by tests/e2e/test_dashboard_e2e.py, which passes:
//   WARREN_URL      the API listener (http://127.0.0.1:<port>)
//   WARREN_KEY      an API key of the team that owns SANDBOX_ID
//   SANDBOX_ID      a running sandbox created through the API
//   POLICY_SANDBOX_ID  (optional) a sandbox with a runaway and an orphans finding, for the fleet page
//   WARREN_BIN      the CLI (runs a command whose output the log tail must push)
//   BUILD_CONTEXT, BUILD_TEMPLATE  (optional) a build context this script builds as template
//                   BUILD_TEMPLATE when it is ready to watch the build's log
//   SHOTS_DIR       where the screenshots go (docs/dashboard/)
// Prints one line per step; exits non-zero at the first failure. Waits are bounded polls on what the
// page shows, never speed assertions.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { spawn } from "node:child_process";

const base = process.env.WARREN_URL;
const key = process.env.WARREN_KEY;
const sandboxId = process.env.SANDBOX_ID;
const policySandboxId = process.env.POLICY_SANDBOX_ID || "";
const buildTemplate = process.env.BUILD_TEMPLATE || "";
const buildContext = process.env.BUILD_CONTEXT || "";
const warrenBin = process.env.WARREN_BIN || "";
const shots = process.env.SHOTS_DIR;
const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
if (!base || !key || !sandboxId || !shots || !warrenBin) throw new Error("WARREN_URL, WARREN_KEY, SANDBOX_ID, SHOTS_DIR and WARREN_BIN are required");
mkdirSync(shots, { recursive: true });
const origin = new URL(base).origin;

function step(name) {
  console.log(`STEP ${name}`);
}

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: chromiumPath,
  headless: true,
  args: [
    "--no-sandbox",
    // Nothing but loopback: no background fetches, and every other host name fails to resolve.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
  ],
});
const blocked = [];
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, acceptDownloads: true });
  // The page may load only from Warren itself.
  await context.route("**/*", (route) => {
    const url = new URL(route.request().url());
    if (url.origin === origin || url.protocol === "data:" || url.protocol === "blob:") return route.continue();
    blocked.push(url.href);
    return route.abort();
  });
  const page = await context.newPage();
  page.on("pageerror", (error) => console.log(`PAGE ERROR ${error.message}`));

  step("401 without a key or session");
  const bare = await page.request.get(`${base}/v2/sandboxes`);
  check(bare.status() === 401, `GET /v2/sandboxes without a key answered ${bare.status()}`);
  const noSession = await page.request.get(`${base}/dashboard/api/session`);
  check(noSession.status() === 401, `session without a cookie answered ${noSession.status()}`);
  await page.goto(`${base}/dashboard/sandboxes`);
  await page.waitForURL("**/dashboard/login");
  await page.getByLabel("API key").waitFor();
  await page.screenshot({ path: `${shots}/login.png` });

  step("a wrong key is refused");
  await page.getByLabel("API key").fill("e2b_wrong");
  await page.getByRole("button", { name: "Log in" }).click();
  await page.locator("#login-error", { hasText: "not valid" }).waitFor();

  step("log in");
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.waitForURL("**/dashboard/sandboxes");
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "warren_session");
  check(session && session.httpOnly && session.sameSite === "Strict", `session cookie ${JSON.stringify(session)}`);
  check(!(await page.evaluate(() => document.cookie)).includes("warren_session"), "the session cookie is readable by scripts");

  step("the sandbox appears in the list");
  await page.locator(`#sandbox-list .row[data-id="${sandboxId}"]`).waitFor({ timeout: 30000 });
  await page.screenshot({ path: `${shots}/sandboxes.png` });
  await page.getByLabel("Filter").fill(sandboxId);
  await page.locator("#sandbox-list .row").first().waitFor();
  check((await page.locator("#sandbox-list .row").count()) === 1, "the filter leaves one row");
  await page.getByLabel("State").selectOption("paused");
  await page.locator(`#sandbox-list .row[data-id="${sandboxId}"]`).waitFor({ state: "detached" });
  await page.getByLabel("State").selectOption("");

  step("detail page with metrics");
  await page.locator(`#sandbox-list a[href="/dashboard/sandboxes/${sandboxId}"]`).click();
  await page.waitForURL(`**/dashboard/sandboxes/${sandboxId}/metrics`);
  await page.locator("#sandbox-state", { hasText: "running" }).waitFor();
  await page.locator("figure.chart").first().waitFor({ timeout: 30000 });
  await page.screenshot({ path: `${shots}/detail-metrics.png` });

  step("terminal: echo $((6*7)) prints 42");
  await page.getByRole("tab", { name: "Terminal" }).click();
  await page.locator("#terminal-status", { hasText: "shell pid" }).waitFor({ timeout: 30000 });
  const screenText = () =>
    page.evaluate(() => {
      const buffer = window.warrenTerminal.buffer.active;
      const lines = [];
      for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i).translateToString(true));
      return lines;
    });
  const waitForLine = async (what, test, bound = 30000) => {
    const deadline = Date.now() + bound;
    for (;;) {
      const lines = await screenText();
      if (lines.some(test)) return lines;
      if (Date.now() > deadline) throw new Error(`terminal never showed ${what}; screen:\n${lines.filter(Boolean).join("\n")}`);
      await page.waitForTimeout(200);
    }
  };
  await page.locator(".xterm-helper-textarea").focus();
  await page.keyboard.type("echo $((6*7))");
  await page.keyboard.press("Enter");
  await waitForLine("42", (l) => l.trim() === "42");
  await page.screenshot({ path: `${shots}/terminal.png` });

  step("terminal: Ctrl-C interrupts, top starts and quits");
  await page.keyboard.type("sleep 600");
  await page.keyboard.press("Enter");
  await page.waitForTimeout(300);
  await page.keyboard.press("Control+C");
  await page.keyboard.type("echo after-$((40+2))");
  await page.keyboard.press("Enter");
  await waitForLine("after-42", (l) => l.trim() === "after-42");
  await page.keyboard.type("top");
  await page.keyboard.press("Enter");
  await waitForLine("top's header", (l) => /load average|Tasks:/.test(l));
  await page.screenshot({ path: `${shots}/terminal-top.png` });
  await page.keyboard.press("q");
  await page.keyboard.type("echo top-done-$((1+1))");
  await page.keyboard.press("Enter");
  await waitForLine("top-done-2", (l) => l.trim() === "top-done-2");
  await page.keyboard.type("htop");
  await page.keyboard.press("Enter");
  await waitForLine("htop's header", (l) => /Load average:/.test(l));
  await page.keyboard.press("q");
  await page.keyboard.type("echo htop-done-$((2+2))");
  await page.keyboard.press("Enter");
  await waitForLine("htop-done-4", (l) => l.trim() === "htop-done-4");

  step("terminal: a file written and saved in vim");
  const vimFile = "/tmp/wt-vim.txt";
  await page.keyboard.type(`vim ${vimFile}`);
  await page.keyboard.press("Enter");
  // vim's empty buffer: its lines past the end show as `~`, the file is new.
  await waitForLine("vim's empty buffer", (l) => l.trim() === "~");
  await waitForLine("vim's new-file message", (l) => l.includes(vimFile));
  await page.keyboard.press("i");
  await page.keyboard.type("typed in vim through the dashboard");
  await page.keyboard.press("Enter");
  await page.keyboard.type("second line: 6*7=42");
  await waitForLine("the typed text in vim", (l) => l.startsWith("second line: 6*7=42"));
  await page.screenshot({ path: `${shots}/terminal-vim.png` });
  await page.keyboard.press("Escape");
  await page.keyboard.type(":wq");
  await page.keyboard.press("Enter");
  await page.keyboard.type(`echo vim-exit=$? lines=$(wc -l < ${vimFile})`);
  await page.keyboard.press("Enter");
  await waitForLine("vim's exit and the saved file's line count", (l) => l.trim() === "vim-exit=0 lines=2");
  await page.keyboard.type(`cat ${vimFile}`);
  await page.keyboard.press("Enter");
  await waitForLine("the saved text through cat", (l) => l.trim() === "second line: 6*7=42");
  const saved = await page.request.get(`${base}/dashboard/api/sandboxes/${sandboxId}/files/content?path=${encodeURIComponent(vimFile)}`);
  check(saved.status() === 200, `reading ${vimFile} through the files API answered ${saved.status()}`);
  const savedText = await saved.text();
  check(savedText === "typed in vim through the dashboard\nsecond line: 6*7=42\n", `the file vim saved holds ${JSON.stringify(savedText)}`);

  step("terminal: after a dropped connection it reattaches to the same shell");
  await page.keyboard.type("export WT_MARK=kept-$((20+1))");
  await page.keyboard.press("Enter");
  const firstPid = await page.locator("#terminal-status").textContent();
  await page.evaluate(() => window.warrenTerminalSocket.close());
  await page.locator("#terminal-status", { hasText: "reconnecting" }).waitFor();
  await page.locator("#terminal-status", { hasText: firstPid ?? "shell pid" }).waitFor({ timeout: 30000 });
  await page.keyboard.type("echo mark=$WT_MARK");
  await page.keyboard.press("Enter");
  await waitForLine("mark=kept-21", (l) => l.trim() === "mark=kept-21");

  step("terminal: a resize reaches the PTY");
  await page.setViewportSize({ width: 900, height: 700 });
  const cols = await page.evaluate(async () => {
    await new Promise((r) => setTimeout(r, 300));
    return window.warrenTerminal.cols;
  });
  await page.keyboard.type("echo cols=$(tput cols)");
  await page.keyboard.press("Enter");
  await waitForLine(`cols=${cols}`, (l) => l.trim() === `cols=${cols}`);
  await page.setViewportSize({ width: 1280, height: 800 });

  step("terminal: a 1 MB paste arrives whole");
  const pasteLines = 10000;
  const line = "x".repeat(99);
  await page.keyboard.type("stty -echo; cat > /tmp/wt-paste; stty echo");
  await page.keyboard.press("Enter");
  await page.waitForTimeout(500);
  await page.evaluate(
    ({ n, text }) => window.warrenTerminal.paste(Array.from({ length: n }, () => text).join("\n") + "\n"),
    { n: pasteLines, text: line },
  );
  await page.keyboard.press("Control+D");
  await page.keyboard.type("echo paste=$(wc -c < /tmp/wt-paste)");
  await page.keyboard.press("Enter");
  await waitForLine(`paste=${pasteLines * 100}`, (l) => l.trim() === `paste=${pasteLines * 100}`, 60000);

  step("processes tab");
  await page.getByRole("tab", { name: "Processes" }).click();
  await page.locator("#process-table tbody tr").first().waitFor();
  await page.screenshot({ path: `${shots}/detail-processes.png` });

  step("logs: a running command's lines are pushed to the open tab");
  // Every request the page makes for the log from here on: a live tail is one stream, a poll would
  // be a request every few seconds.
  const logRequests = [];
  const countLogRequests = (request) => {
    if (new URL(request.url()).pathname.includes(`/${sandboxId}/logs`)) logRequests.push(request.url());
  };
  page.on("request", countLogRequests);
  await page.getByRole("tab", { name: "Logs" }).click();
  await page.locator("#logs-status", { hasText: "live" }).waitFor({ timeout: 30000 });
  const logText = async () => (await page.locator("#sandbox-logs").textContent()) ?? "";
  check(!(await logText()).includes("wt-live-"), "the log shows no wt-live line before the command");
  // Eight lines, one every 0.7 s: the tail must show the first ones while the command still runs.
  const printer = spawn(warrenBin, ["sandbox", "exec", sandboxId, "--", "for i in $(seq 1 8); do echo wt-live-$i; sleep 0.7; done"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let printed = "";
  printer.stdout.on("data", (d) => (printed += d));
  printer.stderr.on("data", (d) => (printed += d));
  const printerEnded = new Promise((resolve) => printer.on("exit", (code) => resolve(code)));
  let printerDone = false;
  void printerEnded.then(() => (printerDone = true));
  await page.waitForFunction(() => (document.querySelector("#sandbox-logs")?.textContent ?? "").includes("wt-live-1"), null, { timeout: 30000 });
  const firstSeen = await logText();
  check(!printerDone && !firstSeen.includes("wt-live-8"), `the first line was shown while the command still ran (log: ${firstSeen.slice(-400)})`);
  await page.waitForFunction(() => (document.querySelector("#sandbox-logs")?.textContent ?? "").includes("wt-live-8"), null, { timeout: 30000 });
  const printerCode = await printerEnded;
  check(printerCode === 0, `warren sandbox exec exited ${printerCode}: ${printed}`);
  const shown = (await logText()).split("\n").filter((l) => / wt-live-\d+$/.test(l)).map((l) => l.split(" ").pop());
  check(JSON.stringify(shown) === JSON.stringify(["1", "2", "3", "4", "5", "6", "7", "8"].map((n) => `wt-live-${n}`)), `each line once, in order: ${shown.join(", ")}`);
  const streamOpen = await page.evaluate(() => window.warrenLogSource.readyState === EventSource.OPEN);
  check(streamOpen, "the log stream is open");
  check(logRequests.length === 1 && logRequests[0].includes("/logs/stream"), `one stream, no polling: ${logRequests.join(", ")}`);
  page.off("request", countLogRequests);
  await page.screenshot({ path: `${shots}/detail-logs.png` });

  step("events tab");
  await page.getByRole("tab", { name: "Events" }).click();
  await page.locator("#event-table tbody tr").first().waitFor();
  await page.screenshot({ path: `${shots}/detail-events.png` });

  step("files: upload and download");
  await page.getByRole("tab", { name: "Files" }).click();
  await page.locator("#files-table").waitFor({ timeout: 30000 });
  const content = `uploaded through the dashboard ${Date.now()}\n`;
  await page.getByLabel("Upload a file here").setInputFiles({ name: "wt-dash-upload.txt", mimeType: "text/plain", buffer: Buffer.from(content) });
  await page.locator("#files-status", { hasText: "uploaded" }).waitFor({ timeout: 30000 });
  const link = page.locator("#files-table tr", { hasText: "wt-dash-upload.txt" }).getByRole("link", { name: "Download" });
  await link.waitFor();
  await page.screenshot({ path: `${shots}/detail-files.png` });
  const [download] = await Promise.all([page.waitForEvent("download"), link.click()]);
  const stream = await download.createReadStream();
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  check(Buffer.concat(chunks).toString() === content, "the downloaded file is the uploaded one");

  // Waits for the action `label` to finish (the page's status line), failing with its message.
  const actionDone = async (label, pattern = new RegExp(`^${label}: done$`)) => {
    const deadline = Date.now() + 180000;
    for (;;) {
      const text = ((await page.locator("#action-status").textContent()) ?? "").trim();
      if (pattern.test(text)) return text;
      check(!text.startsWith(`${label} failed`), `${label}: ${text}`);
      check(Date.now() < deadline, `${label} finished (status: ${text})`);
      await page.waitForTimeout(200);
    }
  };

  step("pause and resume from the buttons, the log tail open");
  // The tail's long poll holds a connection to the agent while the sandbox is checkpointed; the
  // state changes are pushed into the open log.
  await page.getByRole("tab", { name: "Logs" }).click();
  await page.locator("#logs-status", { hasText: "live" }).waitFor({ timeout: 30000 });
  await page.getByRole("button", { name: "Pause" }).click();
  await actionDone("Pause");
  await page.locator("#sandbox-state", { hasText: "paused" }).waitFor({ timeout: 30000 });
  await page.waitForFunction(() => (document.querySelector("#sandbox-logs")?.textContent ?? "").includes("sandbox pausing -> paused"), null, { timeout: 30000 });
  await page.screenshot({ path: `${shots}/detail-paused.png` });
  await page.getByRole("button", { name: "Resume" }).click();
  await actionDone("Resume");
  await page.locator("#sandbox-state", { hasText: "running" }).waitFor({ timeout: 30000 });
  await page.waitForFunction(() => (document.querySelector("#sandbox-logs")?.textContent ?? "").includes("sandbox resuming -> running"), null, { timeout: 30000 });

  step("set timeout, fork x2, snapshot");
  const endsBefore = await page.locator("#sandbox-summary dd").nth(3).textContent();
  await page.getByLabel("Timeout (s)").fill("1800");
  await page.getByRole("button", { name: "Set timeout" }).click();
  await actionDone("Set timeout");
  await page.waitForFunction((before) => document.querySelectorAll("#sandbox-summary dd")[3]?.textContent !== before, endsBefore);
  await page.getByLabel("Forks").fill("2");
  await page.getByRole("button", { name: "Fork" }).click();
  await actionDone("Fork", /^forked: \S+, \S+$/);
  await page.getByRole("button", { name: "Snapshot" }).click();
  await actionDone("Snapshot", /^snapshot \S+ taken$/);
  await page.screenshot({ path: `${shots}/detail-actions.png` });

  if (buildTemplate && buildContext && warrenBin) {
    step("a running build's log streams");
    const build = spawn(warrenBin, ["template", "build", buildContext, "--name", buildTemplate], { stdio: ["ignore", "pipe", "pipe"] });
    let buildOutput = "";
    build.stdout.on("data", (d) => (buildOutput += d));
    build.stderr.on("data", (d) => (buildOutput += d));
    const buildEnded = new Promise((resolve) => build.on("exit", (code) => resolve(code)));
    await page.goto(`${base}/dashboard/templates`);
    const row = page.locator("#template-table tr", { hasText: buildTemplate });
    for (let attempt = 0; (await row.count()) === 0; attempt++) {
      check(attempt < 120, `template ${buildTemplate} listed`);
      await page.waitForTimeout(500);
      await page.reload();
      await page.locator("h1", { hasText: "Templates" }).waitFor();
      await page.waitForLoadState("networkidle");
    }
    await row.getByRole("button", { name: "Builds" }).click();
    await page.locator("#build-status").waitFor();
    // Lines arrive while the build runs: see the count grow at least once before it ends.
    const counts = new Set();
    const deadline = Date.now() + 600000;
    for (;;) {
      const text = (await page.locator("#build-status").textContent()) ?? "";
      const lines = await page.locator("#build-log").textContent();
      if ((lines ?? "").includes("wt-dash-step-")) counts.add((lines ?? "").split("\n").length);
      if (/: (ready|error|failed)/.test(text)) break;
      check(Date.now() < deadline, `the build ended; status ${text}`);
      await page.waitForTimeout(300);
    }
    const log = (await page.locator("#build-log").textContent()) ?? "";
    const finalStatus = await page.locator("#build-status").textContent();
    if (!log.includes("wt-dash-step-5")) {
      await page.screenshot({ path: `${shots}/templates-failed.png` });
      const code = await Promise.race([buildEnded, new Promise((r) => setTimeout(() => r("still running"), 5000))]);
      check(false, `the build log shows the step's output; status ${finalStatus}; log:\n${log}\nCLI (${code}):\n${buildOutput}`);
    }
    check(counts.size >= 2, `the log grew while the build ran (saw ${[...counts].join(", ")} lines)`);
    await page.screenshot({ path: `${shots}/templates.png` });
    const code = await buildEnded;
    check(code === 0, `warren template build exited ${code}:\n${buildOutput}`);
  } else {
    await page.goto(`${base}/dashboard/templates`);
    await page.locator("h1", { hasText: "Templates" }).waitFor();
    await page.screenshot({ path: `${shots}/templates.png` });
  }

  step("snapshots and fleet pages");
  await page.goto(`${base}/dashboard/snapshots`);
  await page.locator("#snapshot-table tbody tr", { hasText: sandboxId }).waitFor();
  await page.screenshot({ path: `${shots}/snapshots.png` });
  await page.goto(`${base}/dashboard/fleet`);
  await page.locator("#count-running").waitFor();

  step("fleet: create and resume latency over time, policy events");
  // This run created sandboxes (the API, forks) and resumed one from the button.
  for (const operation of ["create", "resume", "pause"]) {
    await page.locator(`#latency-chart g[data-series="${operation}"] circle`).first().waitFor({ timeout: 30000 });
    const p50 = (await page.locator(`#latency-table tr[data-operation="${operation}"] td`).nth(1).textContent()) ?? "";
    check(/^\d+ ms$/.test(p50), `${operation} p50 shown as milliseconds (${p50})`);
  }
  if (policySandboxId) {
    for (const [policy, text] of [
      ["runaway_cpu", "runaway process"],
      ["orphans", "reaped 1 orphaned process(es) (on request)"],
    ]) {
      const row = page.locator(`#policy-events tr[data-policy="${policy}"]`, { hasText: policySandboxId });
      await row.first().waitFor({ timeout: 30000 });
      check(((await row.first().textContent()) ?? "").includes(text), `the ${policy} event says ${text}`);
    }
    const runawayRow = page.locator(`#policy-events tr[data-policy="runaway_cpu"]`, { hasText: policySandboxId }).first();
    check(((await runawayRow.textContent()) ?? "").includes("killed by the runaway policy"), "the runaway was killed by its policy");
  }
  await page.screenshot({ path: `${shots}/fleet.png`, fullPage: true });

  step("API keys: make one, see it, revoke it");
  await page.goto(`${base}/dashboard/keys`);
  await page.locator("#key-table").waitFor();
  await page.getByLabel("New key name").fill("wt-dash-key");
  await page.getByRole("button", { name: "Create key" }).click();
  await page.locator("#key-made", { hasText: /new key wt-dash-key: e2b_\w+/ }).waitFor();
  const madeKey = /e2b_\w+/.exec((await page.locator("#key-made").textContent()) ?? "")[0];
  const withKey = await page.request.get(`${base}/v2/sandboxes`, { headers: { "X-API-Key": madeKey } });
  check(withKey.status() === 200, `the new key works (${withKey.status()})`);
  await page.screenshot({ path: `${shots}/keys.png` });
  page.once("dialog", (dialog) => dialog.accept());
  await page.getByRole("button", { name: "Revoke key wt-dash-key" }).click();
  await page.locator("#key-table tr", { hasText: "wt-dash-key" }).waitFor({ state: "detached" });
  const revokedKey = await page.request.get(`${base}/v2/sandboxes`, { headers: { "X-API-Key": madeKey } });
  check(revokedKey.status() === 401, `the revoked key is refused (${revokedKey.status()})`);

  step("the list with 1,000 sandboxes");
  // The API's answers are replaced by 1,000 made-up rows for this page only: what is checked is the
  // windowed list (few rows in the DOM, sorting, scrolling, filtering). Its speed with 1,000 real
  // sandboxes is a benchmark (`./warren-bench --only dashboard`); the figure printed here is
  // reported, not asserted.
  const many = await context.newPage();
  const fakeRows = Array.from({ length: 1000 }, (_, i) => ({
    sandboxID: `i${String(i).padStart(4, "0")}bench`,
    templateID: i % 3 ? "base" : "code-interpreter-v1",
    clientID: "bench",
    startedAt: new Date(Date.now() - i * 1000).toISOString(),
    endAt: new Date(Date.now() + (1000 - i) * 1000).toISOString(),
    cpuCount: 1 + (i % 4),
    memoryMB: 512,
    diskSizeMB: 1024,
    state: i % 5 ? "running" : "paused",
    envdVersion: "0.1.0",
    metadata: { n: String(i) },
  }));
  await many.route(/\/v2\/sandboxes\?/, (route) => {
    const url = new URL(route.request().url());
    const from = Number(url.searchParams.get("nextToken") ?? "0");
    const headers = { "content-type": "application/json" };
    if (from + 100 < fakeRows.length) headers["x-next-token"] = String(from + 100);
    return route.fulfill({ status: 200, headers, body: JSON.stringify(fakeRows.slice(from, from + 100)) });
  });
  await many.route(/\/sandboxes\/metrics\?/, (route) => route.fulfill({ status: 200, contentType: "application/json", body: '{"sandboxes":{}}' }));
  const started = Date.now();
  await many.goto(`${base}/dashboard/sandboxes`);
  await many.locator("#sandbox-list").locator("xpath=..").getByText("1000 of 1000 sandboxes").waitFor({ timeout: 60000 });
  console.log(`MEASURE list of 1000 sandboxes shown ${Date.now() - started} ms after navigation`);
  const domRows = await many.locator("#sandbox-list .row").count();
  check(domRows > 0 && domRows < 100, `only the rows in view are in the DOM (${domRows})`);
  await many.getByRole("button", { name: "CPU" }).click();
  await many.getByRole("button", { name: "CPU ▲" }).waitFor();
  await many.locator("#sandbox-list .viewport").evaluate((el) => (el.scrollTop = 20000));
  // Scrolled far down, the rows there are drawn (and still only a window of them).
  await many.waitForFunction(() => [...document.querySelectorAll("#sandbox-list .row")].some((r) => parseInt(r.style.top, 10) >= 20000));
  await many.getByLabel("Filter").fill("n=999");
  await many.getByText("1 of 1000 sandboxes").waitFor();
  await many.getByLabel("Filter").fill("");
  await many.screenshot({ path: `${shots}/sandboxes-1000.png` });
  await many.close();

  step("log out");
  await page.getByRole("button", { name: "Log out" }).click();
  await page.waitForURL("**/dashboard/login");
  const after = await page.request.get(`${base}/dashboard/api/session`);
  check(after.status() === 401, `session after logout answered ${after.status()}`);
  await page.goto(`${base}/dashboard/sandboxes`);
  await page.waitForURL("**/dashboard/login");

  check(blocked.length === 0, `the page tried to load from elsewhere: ${blocked.join(", ")}`);
  console.log("OK all dashboard steps passed");
} finally {
  await browser.close();
}
