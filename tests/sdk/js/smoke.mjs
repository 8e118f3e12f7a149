// Drives a host-mode warren-agent through the official e2b JS SDK. Usage: node smoke.mjs URL
// Exits non-zero (with the failed check) on the first mismatch.
import assert from "node:assert/strict";
import { Sandbox, CommandExitError } from "e2b";

const url = process.argv[2];
// Same construction as the Python fixtures: no control plane, the agent's URL and envd version.
const sbx = new Sandbox({ sandboxId: "wt-host-agent", envdVersion: "0.6.4", sandboxUrl: url, apiKey: "wt-unused" });

const r = await sbx.commands.run("echo js; echo err >&2");
assert.equal(r.exitCode, 0);
assert.equal(r.stdout, "js\n");
assert.equal(r.stderr, "err\n");

await assert.rejects(sbx.commands.run("exit 3"), (e) => e instanceof CommandExitError && e.exitCode === 3);

await sbx.files.write("js.txt", "from js");
assert.equal(await sbx.files.read("js.txt"), "from js");
assert.ok((await sbx.files.list(".")).some((e) => e.path === "/home/user/js.txt"));

const bg = await sbx.commands.run("sleep 30", { background: true });
assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid));
assert.equal(await bg.kill(), true);

// The JS SDK watches with the streaming WatchDir RPC.
const events = [];
const watcher = await sbx.files.watchDir(".", (e) => events.push(`${e.name}:${e.type}`));
await sbx.files.write("watched.txt", "x");
for (let i = 0; i < 200 && !events.includes("watched.txt:create"); i++) {
  await new Promise((done) => setTimeout(done, 25));
}
await watcher.stop();
assert.ok(events.includes("watched.txt:create"), `events: ${events}`);

let screen = "";
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { screen += new TextDecoder().decode(d); } });
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size; exit\n"));
await pty.wait().catch(() => {});
assert.ok(screen.includes("24 80"), `pty screen: ${screen}`);

console.log("js sdk: all checks passed");
