// The seed scenario with the unmodified JavaScript SDK (e2b from npm), Node.js 20.
// Env: E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL. Prints one JSON line.
const { Sandbox } = require('e2b')

const SERVER_PY = 'import os, time, uuid\nprint(f"server.py started pid={os.getpid()} boot={uuid.uuid4().hex}", flush=True)\nwhile True:\n    time.sleep(3600)\n'
const CMD = 'PYTHONPATH=/workspace/pylibs PATH=/workspace/npm/bin:$PATH python3 server.py > service.log 2>&1'

async function logLine(sbx) {
  for (let i = 0; i < 100; i++) {
    const out = (await sbx.commands.run('cat service.log || true', { cwd: '/workspace' })).stdout.trim()
    if (out) return out
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error('service.log stayed empty')
}

async function main() {
  const sbx = await Sandbox.create('sandbox-base', {
    timeoutMs: 5 * 60 * 1000,
    lifecycle: { onTimeout: 'pause', autoResume: true },
  })
  await sbx.files.write('/workspace/server.py', SERVER_PY)
  await sbx.commands.run(CMD, { background: true, timeoutMs: 0, cwd: '/workspace' })
  const before = await logLine(sbx)
  const paused = sbx.pause ? await sbx.pause() : await sbx.betaPause()
  const info = await sbx.getInfo()
  const snapshot = JSON.parse(Buffer.from(info.metadata.snapshot, 'base64').toString())
  const again = await Sandbox.connect(sbx.sandboxId)
  const after = await logLine(again)
  const tail = (await again.commands.run('tail service.log', { cwd: '/workspace' })).stdout
  await again.kill()
  let gone = false
  try { await Sandbox.getInfo(sbx.sandboxId) } catch (e) { gone = true }
  console.log(JSON.stringify({ paused, state: info.state, snapshot, before, after, tail, gone }))
}

main().catch((e) => { console.error(e); process.exit(1) })
