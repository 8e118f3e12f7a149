// One `warren lab` level played in Debian's Chromium (headless, through playwright-core), at the URL
// `warren lab start` printed: `http://8080-<id>.<domain>:<port>/`, the host name resolved to loopback by
// Chromium's own resolver rules (no DNS), so the browser goes through Warren's proxy by Host as a
// player's would. Run by tests/e2e/test_lab_e2e.py, which passes:
//   LAB_URL   the printed URL
//   PHASE     "wrong": level 1's page shows, a wrong flag typed in its box is refused on the page;
//             "solve": (after the judge passed level 1) the page shows the flag, typed in the box it
//             is accepted and the browser lands on level 2
// Prints one line per step; exits non-zero at the first failure.
import { chromium } from "playwright-core";

const labUrl = process.env.LAB_URL;
const phase = process.env.PHASE;
const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
if (!labUrl || !["wrong", "solve"].includes(phase)) throw new Error("LAB_URL and PHASE (wrong|solve) are required");
const { hostname, origin } = new URL(labUrl);

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: chromiumPath,
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    // The lab's host name is loopback; every other name fails to resolve.
    `--host-resolver-rules=MAP ${hostname} 127.0.0.1, MAP * ~NOTFOUND, EXCLUDE 127.0.0.1`,
  ],
});
try {
  const page = await browser.newPage();
  const blocked = [];
  await page.route("**/*", (route) => {
    if (new URL(route.request().url()).origin === origin) return route.continue();
    blocked.push(route.request().url());
    return route.abort();
  });
  await page.goto(new URL("level/1", labUrl).href);
  check((await page.textContent("#title")).includes("Level 1:"), "level 1's page shows");
  console.log("STEP level 1 open");
  if (phase === "wrong") {
    await page.fill("input[name=flag]", "WARREN{00000000000000000000000000000000}");
    await Promise.all([page.waitForLoadState("load"), page.click("form button")]);
    check((await page.textContent("#note")).includes("Wrong flag"), "a wrong flag is refused on the page");
    check((await page.$("#done")) === null, "nothing was accepted");
    console.log("STEP wrong flag refused");
  } else {
    const flag = (await page.textContent("#flag")).trim();
    check(/^WARREN\{[0-9a-f]+\}$/.test(flag), `the judge's flag shows on the page (${flag})`);
    await page.fill("input[name=flag]", flag);
    await Promise.all([page.waitForURL(/\/level\/2$/), page.click("form button")]);
    check((await page.textContent("#title")).includes("Level 2:"), "the right flag opens level 2");
    console.log("STEP flag accepted, level 2 open");
  }
  check(blocked.length === 0, `requests left the lab's origin: ${blocked.join(", ")}`);
  console.log("OK lab level in chromium");
} finally {
  await browser.close();
}
