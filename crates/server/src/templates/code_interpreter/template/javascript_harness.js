// Warren's JavaScript cells: one Node.js process per kernel, its state kept between cells. The kernel
// (javascript_kernel.py) writes one JSON request per line on our stdin ({"code", "silent"}); we answer
// on file descriptor 3 with one JSON message per line: {"type": "stream", "name", "text"} while the
// cell runs, then {"type": "result", "text"} or {"type": "error", "name", "value", "traceback"}, and
// {"type": "done"}. A cell runs in this process's own global scope (`let`, `const`, functions and
// `require`d modules stay for the next cell); a returned promise is awaited; SIGINT interrupts a cell.
// With WARREN_KERNEL_LANGUAGE=typescript a cell is TypeScript: transpiled (not type-checked) by the
// `typescript` package first, its syntax errors reported as a SyntaxError.
"use strict";
const fs = require("fs");
const readline = require("readline");
const util = require("util");
const vm = require("vm");
const { createRequire } = require("module");

// The kernel hands us the write end of its channel and names it.
const channel = Number(process.env.WARREN_CHANNEL_FD || 3);
function send(message) {
  fs.writeSync(channel, JSON.stringify(message) + "\n");
}

let silent = false;
function stream(name) {
  return (chunk, encoding, callback) => {
    const text = typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
    if (!silent) send({ type: "stream", name, text });
    if (typeof encoding === "function") encoding();
    else if (typeof callback === "function") callback();
    return true;
  };
}
// What a cell prints, however it prints it, goes over the channel in order with its result.
process.stdout.write = stream("stdout");
process.stderr.write = stream("stderr");
console.log = (...args) => process.stdout.write(util.format(...args) + "\n");
console.info = console.log;
console.debug = console.log;
console.error = (...args) => process.stderr.write(util.format(...args) + "\n");
console.warn = console.error;

globalThis.require = createRequire(process.cwd() + "/");

const typescript = process.env.WARREN_KERNEL_LANGUAGE === "typescript"
  ? require(process.env.WARREN_TYPESCRIPT || "/usr/local/lib/node_modules/typescript")
  : null;
// Transpiled cells with `import` assign to these, as CommonJS modules do.
globalThis.exports = globalThis.exports || {};

function transpile(code, filename) {
  const ts = typescript;
  const out = ts.transpileModule(code, {
    fileName: `${filename}.ts`,
    reportDiagnostics: true,
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.CommonJS,
      esModuleInterop: true,
    },
  });
  const errors = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
  if (errors.length > 0) {
    const first = errors[0];
    const text = ts.flattenDiagnosticMessageText(first.messageText, "\n");
    const where = first.file && first.start !== undefined
      ? first.file.getLineAndCharacterOfPosition(first.start)
      : null;
    const error = new SyntaxError(where ? `${text} (${filename}:${where.line + 1}:${where.character + 1})` : text);
    error.stack = `SyntaxError: ${error.message}`;
    throw error;
  }
  return out.outputText;
}

let count = 0;
function errorMessage(error) {
  if (error instanceof Error) {
    return {
      type: "error",
      name: error.name || "Error",
      value: error.message,
      // The harness's own frames (and Node's vm internals below a cell) say nothing to the user.
      traceback: String(error.stack || `${error.name}: ${error.message}`)
        .split("\n")
        .filter((line) => !line.includes("node:") && !line.includes(__filename)),
    };
  }
  return { type: "error", name: "Error", value: util.inspect(error), traceback: [`Uncaught ${util.inspect(error)}`] };
}

async function run(request) {
  silent = Boolean(request.silent);
  count += 1;
  try {
    globalThis.require = createRequire(process.cwd() + "/");
    const filename = `<cell ${count}>`;
    const source = typescript ? transpile(request.code, filename) : request.code;
    let value = vm.runInThisContext(source, {
      filename,
      breakOnSigint: true,
    });
    if (value && typeof value.then === "function") value = await value;
    if (value !== undefined && !silent) send({ type: "result", text: util.inspect(value, { colors: false }) });
  } catch (error) {
    // Even a silent cell's error is told: it is how the server's bookkeeping learns it failed.
    send(errorMessage(error));
  } finally {
    silent = false;
    send({ type: "done" });
  }
}

// A SIGINT between cells (an interrupt that came late) must not end the process.
process.on("SIGINT", () => {});
// Errors thrown later (in a timer or callback a cell left behind) are printed, not fatal.
process.on("uncaughtException", (error) => process.stderr.write(`Uncaught ${error.stack || error}\n`));
process.on("unhandledRejection", (error) => process.stderr.write(`Unhandled promise rejection: ${util.inspect(error)}\n`));

let queue = Promise.resolve();
readline.createInterface({ input: process.stdin, terminal: false }).on("line", (line) => {
  let request;
  try {
    request = JSON.parse(line);
  } catch (error) {
    send({ type: "error", name: "ProtocolError", value: String(error), traceback: [] });
    send({ type: "done" });
    return;
  }
  queue = queue.then(() => run(request));
});
