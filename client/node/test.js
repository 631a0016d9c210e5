#!/usr/bin/env node
// Runs example.js against a live attention-server on a free loopback port and checks its
// output. Run by CTest as node_client_test (ATTENTION_SERVER_BINARY set there). Without
// node_modules it skips with a message, except under CI (CI set), where that is a failure.
const assert = require('assert');
const fs = require('fs');
const net = require('net');
const path = require('path');
const {spawn, execFile} = require('child_process');

const REPO = path.join(__dirname, '..', '..');
const SERVER = process.env.ATTENTION_SERVER_BINARY ||
    path.join(REPO, 'build', 'bin', 'attention-server');

function freePort() {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const {port} = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function run(args) {
  return new Promise((resolve) => {
    execFile(process.execPath, args, {timeout: 60000}, (err, stdout, stderr) => {
      resolve({code: err ? (err.code || 1) : 0, stdout, stderr});
    });
  });
}

async function main() {
  if (!fs.existsSync(path.join(__dirname, 'node_modules', '@grpc', 'grpc-js'))) {
    const message = 'client/node/node_modules is missing (scripts/install_deps.sh runs npm ci)';
    if (process.env.CI) throw new Error(message);
    console.log(`SKIP: ${message}`);
    return;
  }
  const port = await freePort();
  const server = spawn(SERVER, ['--host=127.0.0.1', `--port=${port}`, '--metrics_port=0'],
                       {stdio: ['ignore', 'ignore', 'inherit']});
  const exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));
  try {
    // Wait (bounded) until the example gets through: the server loads before serving.
    let result;
    for (let i = 0; i < 100; ++i) {
      result = await run([path.join(__dirname, 'example.js'), `127.0.0.1:${port}`]);
      if (result.code === 0) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    console.log(result.stdout.trim());
    assert.strictEqual(result.code, 0, result.stderr);
    assert.match(result.stdout, /output shape \[1, 8, 256\] DATA_TYPE_FLOAT32/);
    assert.match(result.stdout, /batch_requests 1/);
    const bad = await run([path.join(__dirname, 'example.js'), `127.0.0.1:${await freePort()}`]);
    assert.notStrictEqual(bad.code, 0, 'an unreachable server must fail');
    assert.match(bad.stderr, /attention example failed/);
  } finally {
    server.kill('SIGTERM');
  }
  assert.strictEqual(await exited, 0, 'attention-server exits 0 on SIGTERM');
  console.log('1 passed, 0 failed');
}

main().catch((err) => {
  console.error(err.stack || err.message);
  process.exit(1);
});
