// The official @e2b/code-interpreter JS SDK (pinned in tests/sdk/js/package-lock.json) against a real
// `warren up` (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY in the environment), run by
// tests/e2e/test_code_interpreter_e2e.py::test_js_sdk. Exits non-zero on the first failed check.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const started = Date.now()
const step = (name) => console.log(`${((Date.now() - started) / 1000).toFixed(2)}s ${name}`)
const sbx = await Sandbox.create({ timeoutMs: 300_000 })
step('created')
try {
  await sbx.runCode('x = 20')
  const stdout = []
  const execution = await sbx.runCode('print("from js", flush=True)\nx * 2 + 2', {
    onStdout: (m) => stdout.push(m.line),
  })
  assert.equal(execution.text, '42')
  assert.deepEqual(stdout, ['from js\n'])
  assert.deepEqual(execution.logs.stdout, ['from js\n'])
  assert.ok(execution.executionCount >= 2, `executionCount ${execution.executionCount}`)

  step('const failed =')
  const failed = await sbx.runCode('raise ValueError("bad input")')
  assert.equal(failed.error.name, 'ValueError')
  assert.equal(failed.error.value, 'bad input')
  assert.match(failed.error.traceback, /raise ValueError/)

  step('const frame =')
  const frame = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
  assert.match(frame.results[0].html, /<table/)
  assert.deepEqual(frame.results[0].data, { a: [1, 2] })

  step('const chart =')
  const chart = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 3], label='s')\nplt.title('JS')\nplt.show()",
  )
  assert.ok(chart.results[0].png.length > 100)
  assert.equal(chart.results[0].chart.type, 'line')
  assert.equal(chart.results[0].chart.title, 'JS')

  step('const env =')
  const env = await sbx.runCode("import os\nos.environ['JS_VAR']", { envs: { JS_VAR: 'set' } })
  assert.equal(env.text, 'set')

  step('const ctx =')
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text, '/tmp')
  const listed = await sbx.listCodeContexts()
  assert.ok(listed.some((c) => c.id === ctx.id))
  await sbx.removeCodeContext(ctx)

  step('await assert.rejects(() => sbx')
  await assert.rejects(() => sbx.runCode('while True: pass', { timeoutMs: 2000 }))
  step('assert.equal((await sbx.runCod')
  assert.equal((await sbx.runCode('x')).text, '20')

  step('const js = await sbx.runCode')
  // A JavaScript cell from the JS SDK, with its state kept for the next one.
  const js = await sbx.runCode('const answer = 6 * 7; console.log("js says", answer); answer', { language: 'js' })
  assert.equal(js.error, undefined)
  assert.deepEqual(js.logs.stdout, ['js says 42\n'])
  assert.equal(js.text, '42')
  assert.equal((await sbx.runCode('answer + 1', { language: 'javascript' })).text, '43')

  step('// The JS SDK reports')
  // The JS SDK reports only the status of a refused request (the body naming the language is dropped).
  await assert.rejects(() => sbx.runCode('1', { language: 'java' }), /400/)
  console.log('all checks passed')
} finally {
  await sbx.kill()
  step('killed')
}
// runCode leaves its request timer (60 s) running when a request is refused, which would keep Node up.
process.exit(0)
