#!/usr/bin/env node
// Checks example.js's channel against in-process fake replicas (grpc-js servers), then runs
// example.js and session_example.js against a live attention-server on a free loopback port
// (with --advertise_address, so session ids name the replica) and checks their output, and
// again against one with mutual TLS and bearer tokens (certificates made with openssl).
// Run by CTest as node_client_test (ATTENTION_SERVER_BINARY set there). Without
// node_modules it skips with a message, except under CI (CI set), where that is a failure.
const assert = require('assert');
const crypto = require('crypto');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const {spawn, execFile, execFileSync} = require('child_process');

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

function run(args, env = process.env) {
  return new Promise((resolve) => {
    execFile(process.execPath, args, {timeout: 60000, env}, (err, stdout, stderr) => {
      resolve({code: err ? (err.code || 1) : 0, stdout, stderr});
    });
  });
}

// A grpc-js server standing in for one replica: Infer counts its calls (attempts), the bytes
// of each query and its authorization metadata, and answers OK or fails with `inferCode`
// (UNAVAILABLE: a draining replica).
async function fakeBackend(grpc, attention, inferCode) {
  const backend = {calls: 0, queryBytes: [], authorization: []};
  backend.server = new grpc.Server({'grpc.max_receive_message_length': 16 << 20});
  backend.server.addService(attention.v1.AttentionService.service, {
    Infer: (call, callback) => {
      backend.calls += 1;
      backend.queryBytes.push(call.request.query.data.length);
      backend.authorization.push(call.metadata.get('authorization'));
      if (inferCode === undefined) callback(null, {request_id: call.request.request_id});
      else callback({code: inferCode, details: 'server is shutting down'});
    },
  });
  const port = await new Promise((resolve, reject) => {
    backend.server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(),
                             (err, p) => (err ? reject(err) : resolve(p)));
  });
  backend.address = `127.0.0.1:${port}`;
  return backend;
}

function inferRequest(seqLen) {
  const data = Buffer.alloc(seqLen * 256 * 4);  // float32 zeros (1, seqLen, 256).
  return {query: {dtype: 'DATA_TYPE_FLOAT32', shape: [1, seqLen, 256], data}};
}

async function channelTests() {
  const grpc = require('@grpc/grpc-js');
  const example = require('./example.js');
  const attention = example.loadAttention();
  const backends = [];
  const clients = [];
  try {
    // The settings: attention-client's retry policy, round_robin with health checking, and
    // retry buffers as large as the largest message.
    const config = example.serviceConfig();
    assert.deepStrictEqual(config.loadBalancingConfig, [{round_robin: {}}]);
    assert.deepStrictEqual(config.healthCheckConfig, {serviceName: ''});
    assert.deepStrictEqual(config.methodConfig[0].retryPolicy, {
      maxAttempts: 4, initialBackoff: '0.02s', maxBackoff: '0.5s', backoffMultiplier: 2,
      retryableStatusCodes: ['UNAVAILABLE'],
    });
    // Session calls without effect on a session's contents are retried; Append is not.
    assert.deepStrictEqual(config.methodConfig[0].name.slice(1).map((n) => n.method),
                           ['CreateSession', 'GetSession', 'CloseSession']);
    assert.deepStrictEqual(example.serviceConfig('pick_first').loadBalancingConfig,
                           [{pick_first: {}}]);
    const options = example.channelOptions();
    assert.deepStrictEqual(JSON.parse(options['grpc.service_config']), config);
    for (const name of ['grpc.per_rpc_retry_buffer_size', 'grpc.retry_buffer_size']) {
      assert.ok(options[name] >= options['grpc.max_send_message_length'], name);
    }
    console.log('ok: channel settings');

    // Requests over grpc-js's per-call retry buffer (1 MiB by default) were committed at
    // once: 1 attempt instead of maxAttempts (4).
    const failing = await fakeBackend(grpc, attention, grpc.status.UNAVAILABLE);
    backends.push(failing);
    const client = example.makeClient(failing.address);
    clients.push(client);
    for (const seqLen of [16, 512, 2048]) {  // 16 KiB, 512 KiB and 2 MiB queries.
      failing.calls = 0;
      await assert.rejects(example.call(client, 'Infer', inferRequest(seqLen)),
                           (err) => err.code === grpc.status.UNAVAILABLE);
      assert.strictEqual(failing.calls, 4, `attempts of a ${seqLen * 1024} byte query`);
      assert.strictEqual(failing.queryBytes.at(-1), seqLen * 1024);
    }
    console.log('ok: large requests are retried');

    // The first address drains (its Infer answers UNAVAILABLE): pick_first sent every
    // attempt to it; round_robin retries on the next replica, so every call succeeds.
    const draining = await fakeBackend(grpc, attention, grpc.status.UNAVAILABLE);
    const serving = await fakeBackend(grpc, attention);
    backends.push(draining, serving);
    const balanced = example.makeClient(`ipv4:${draining.address},${serving.address}`);
    clients.push(balanced);
    for (let i = 0; i < 8; ++i) {
      const request = {request_id: `r${i}`, ...inferRequest(2)};
      const response = await example.call(balanced, 'Infer', request);
      assert.strictEqual(response.request_id, `r${i}`);
    }
    assert.strictEqual(serving.calls, 8);
    console.log(`ok: a draining replica is retried around (it got ${draining.calls} attempts)`);

    // On plaintext the token (here from ATTENTION_TOKEN, trimmed) goes as per-call metadata,
    // on every call; without one, none is sent.
    const security = example.channelSecurity({}, {ATTENTION_TOKEN: ' node-token\n'});
    assert.strictEqual(security.tls, false);
    const tokened = example.makeClient(serving.address, 'round_robin', security);
    clients.push(tokened);
    for (let i = 0; i < 2; ++i) {
      await example.call(tokened, 'Infer', inferRequest(2), security.metadata);
    }
    assert.deepStrictEqual(serving.authorization.slice(-3),
                           [[], ['Bearer node-token'], ['Bearer node-token']]);
    // The flags: any --tls_* implies TLS; bad combinations are refused naming the flag.
    const parsed = example.parseCommandLine(['h:1', 'pick_first', '--tls_server_name=localhost'],
                                            {});
    assert.deepStrictEqual(
        [parsed.target, parsed.lbPolicy, parsed.security.tls, parsed.security.options],
        ['h:1', 'pick_first', true, {'grpc.ssl_target_name_override': 'localhost'}]);
    assert.strictEqual(example.parseCommandLine([], {}).security.tls, false);
    assert.throws(() => example.parseCommandLine(['--tls_cert_file', 'c.pem'], {}),
                  /^Error: --tls_key_file: required with --tls_cert_file/);
    assert.throws(() => example.parseCommandLine(['--tls_key_file=c.key'], {}),
                  /^Error: --tls_cert_file: required with --tls_key_file/);
    assert.throws(() => example.parseCommandLine(['--tls_ca_file=/nonexistent/ca.pem'], {}),
                  /^Error: --tls_ca_file: cannot read '\/nonexistent\/ca.pem'/);
    assert.throws(() => example.channelSecurity({}, {ATTENTION_TOKEN: 'two words'}),
                  /^Error: ATTENTION_TOKEN: a bearer token is printable ASCII/);
    assert.throws(() => example.parseCommandLine(['--token'], {}), /Unknown option '--token'/);
    console.log('ok: security flags, and the token as per-call metadata on plaintext');
  } finally {
    for (const client of clients) client.close();
    for (const backend of backends) backend.server.forceShutdown();
  }
  return 4;
}

// The examples against a server with mutual TLS and bearer tokens: certificates (a CA, a
// server certificate for localhost/127.0.0.1, a client certificate) made with openssl, the
// tokens file of one random token's SHA-256. example.js gets the token from --token_file,
// session_example.js from ATTENTION_TOKEN; without a token calls are UNAUTHENTICATED.
async function tlsTokenTest() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attention-node-tls-'));
  const file = (name) => path.join(dir, name);
  try {
    execFileSync('sh', ['-c', `set -e
      printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > server.ext
      printf 'extendedKeyUsage=clientAuth\\n' > client.ext
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \\
        -keyout ca.key -out ca.pem -days 2 -subj /CN=attention-node-test-ca
      for who in server client; do
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \\
          -keyout $who.key -out $who.csr -subj /CN=$who
        openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial \\
          -out $who.pem -days 2 -extfile $who.ext
      done`], {cwd: dir, stdio: ['ignore', 'ignore', 'pipe']});
    const token = crypto.randomBytes(24).toString('base64url');
    const digest = crypto.createHash('sha256').update(token).digest('hex');
    fs.writeFileSync(file('tokens'), `${digest} node-test *\n`);
    fs.writeFileSync(file('token'), `${token}\n`);

    const port = await freePort();
    const server = spawn(SERVER, [
      '--host=127.0.0.1', `--port=${port}`, '--metrics_port=0', '--http_port=0',
      `--advertise_address=127.0.0.1:${port}`, `--tls_cert_file=${file('server.pem')}`,
      `--tls_key_file=${file('server.key')}`, `--tls_client_ca_file=${file('ca.pem')}`,
      `--auth_tokens_file=${file('tokens')}`], {stdio: ['ignore', 'ignore', 'inherit']});
    const exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));
    const flags = [`127.0.0.1:${port}`, `--tls_ca_file=${file('ca.pem')}`,
                   `--tls_cert_file=${file('client.pem')}`, `--tls_key_file=${file('client.key')}`,
                   '--tls_server_name=localhost'];
    const {ATTENTION_TOKEN, ...noToken} = process.env;
    try {
      let result;
      for (let i = 0; i < 100; ++i) {  // Until the server is up (bounded).
        result = await run([path.join(__dirname, 'example.js'), ...flags,
                            `--token_file=${file('token')}`], noToken);
        if (result.code === 0 || server.exitCode !== null) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.strictEqual(result.code, 0, result.stderr);
      assert.match(result.stdout, /output shape \[1, 8, 256\] DATA_TYPE_FLOAT32/);

      const session = await run([path.join(__dirname, 'session_example.js'), ...flags],
                                 {...noToken, ATTENTION_TOKEN: token});
      assert.strictEqual(session.code, 0, session.stderr);
      assert.match(session.stdout, new RegExp(`session [0-9a-f]{32}@127\\.0\\.0\\.1:${port} `));
      assert.match(session.stdout, /^final length 8, keys 8, [1-9]\d* bytes held$/m);

      const refused = await run([path.join(__dirname, 'example.js'), ...flags], noToken);
      assert.notStrictEqual(refused.code, 0, 'a call without a token must fail');
      assert.match(refused.stderr, /attention example failed: code 16: /);  // UNAUTHENTICATED
    } finally {
      server.kill('SIGTERM');
    }
    assert.strictEqual(await exited, 0, 'attention-server (TLS) exits 0 on SIGTERM');
    console.log('ok: example.js and session_example.js over mutual TLS with a bearer token');
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
  return 1;
}

async function main() {
  if (!fs.existsSync(path.join(__dirname, 'node_modules', '@grpc', 'grpc-js'))) {
    const message = 'client/node/node_modules is missing (scripts/install_deps.sh runs npm ci)';
    if (process.env.CI) throw new Error(message);
    console.log(`SKIP: ${message}`);
    return;
  }
  const passed = await channelTests();
  const port = await freePort();
  const server = spawn(SERVER, ['--host=127.0.0.1', `--port=${port}`, '--metrics_port=0', '--http_port=0', '--http_port=0',
                                `--advertise_address=127.0.0.1:${port}`],
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
    console.log('ok: example.js');

    // A session: 8 tokens appended one at a time, then closed.
    const session = await run([path.join(__dirname, 'session_example.js'), `127.0.0.1:${port}`]);
    console.log(session.stdout.trim());
    assert.strictEqual(session.code, 0, session.stderr);
    const id = `[0-9a-f]{32}@127\\.0\\.0\\.1:${port}`;  // --advertise_address: routed there.
    assert.match(session.stdout, new RegExp(`session ${id} \\(SESSION_KIND_SELF\\)`));
    for (let i = 0; i < 8; ++i) {
      assert.match(session.stdout, new RegExp(`append ${i}: length ${i + 1}, output \\[1, 256\\]`));
    }
    assert.match(session.stdout, /^final length 8, keys 8, [1-9]\d* bytes held$/m);
    assert.match(session.stdout, /^closed: [1-9]\d* bytes freed$/m);
    const unreachable = await run([path.join(__dirname, 'session_example.js'),
                                   `127.0.0.1:${await freePort()}`]);
    assert.notStrictEqual(unreachable.code, 0, 'an unreachable server must fail');
    assert.match(unreachable.stderr, /attention session example failed/);
    console.log('ok: session_example.js');
  } finally {
    server.kill('SIGTERM');
  }
  assert.strictEqual(await exited, 0, 'attention-server exits 0 on SIGTERM');
  const secured = await tlsTokenTest();
  console.log(`${passed + 2 + secured} passed, 0 failed`);
}

main().catch((err) => {
  console.error(err.stack || err.message);
  process.exit(1);
});
