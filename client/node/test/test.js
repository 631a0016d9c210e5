#!/usr/bin/env node
// Tests of the attention-client Node.js package: its channel settings, target checks, error
// names and hints, retries and balancing against in-process fake replicas (grpc-js servers);
// then the library (infer, inferStream, sessions with replay, health, waitReady, message
// limits; inferStream reopened when the server closes it, against a fake server and a server
// whose connections live 0.3 s) and the examples against live attention-servers on free
// loopback ports, plaintext and with mutual TLS and a bearer token (certificates made with
// openssl), and the hints for TLS mistakes.
//
// Run by CTest twice: node_client_test against the source tree (client/node), and
// node_package_test (installed_test.sh) against the package installed from its `npm pack`
// tarball into an empty folder (ATTENTION_NODE_INSTALLED=1: this file is run from that folder
// and must load the installed package, examples included). ATTENTION_SERVER_BINARY names the
// server. Without node_modules it skips with a message, except under CI (CI set).
'use strict';
const assert = require('assert');
const crypto = require('crypto');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const {spawn, execFile, execFileSync} = require('child_process');

const INSTALLED = process.env.ATTENTION_NODE_INSTALLED === '1';
const PACKAGE_DIR = INSTALLED ? path.dirname(require.resolve('attention-client')) :
    path.join(__dirname, '..');
const SERVER = process.env.ATTENTION_SERVER_BINARY ||
    path.join(__dirname, '..', '..', '..', 'build', 'bin', 'attention-server');
const EXAMPLES = path.join(PACKAGE_DIR, 'examples');

let passed = 0;
function ok(what) {
  passed += 1;
  console.log(`ok: ${what}`);
}

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

function zeros(lib, ...shape) {
  return lib.float32(new Float32Array(shape.reduce((a, b) => a * b, 1)), shape);
}

function randn(lib, ...shape) {
  const n = shape.reduce((a, b) => a * b, 1);
  return lib.float32(Float32Array.from({length: n}, (_, i) => Math.sin(i * 0.61 + shape[0])),
                     shape);
}

function maxDiff(a, b) {
  assert.strictEqual(a.length, b.length);
  let d = 0;
  for (let i = 0; i < a.length; ++i) d = Math.max(d, Math.abs(a[i] - b[i]));
  return d;
}

async function startServer(flags = []) {
  const port = await freePort();
  const server = spawn(SERVER, ['--host=127.0.0.1', `--port=${port}`, '--metrics_port=0',
                                '--http_port=0', `--advertise_address=127.0.0.1:${port}`,
                                ...flags],
                       {stdio: ['ignore', 'ignore', 'inherit']});
  server.exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));
  server.target = `127.0.0.1:${port}`;
  return server;
}

async function stopServer(server) {
  server.kill('SIGTERM');
  return server.exited;
}

// A grpc-js server standing in for one replica: Infer counts its calls (attempts), the bytes
// of each query and its authorization metadata, and answers OK or fails with `inferCode`.
async function fakeBackend(grpc, v1, inferCode) {
  const backend = {calls: 0, queryBytes: [], authorization: []};
  backend.server = new grpc.Server({'grpc.max_receive_message_length': 16 << 20});
  backend.server.addService(v1.AttentionService.service, {
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

function offlineTests(lib) {
  // The package: its version is the project's; the protos it loads are its own when installed.
  assert.strictEqual(lib.VERSION, process.env.ATTENTION_VERSION || lib.VERSION);
  if (INSTALLED) {
    assert.ok(!path.relative(process.cwd(), PACKAGE_DIR).startsWith('..'),
              `${PACKAGE_DIR} is not under ${process.cwd()}`);
    assert.strictEqual(lib.protoRoot(), path.join(PACKAGE_DIR, 'proto'));
    assert.ok(fs.existsSync(path.join(PACKAGE_DIR, 'index.d.ts')));
  }
  ok(`package ${lib.VERSION} at ${PACKAGE_DIR}`);

  const config = lib.serviceConfig();
  assert.deepStrictEqual(config.loadBalancingConfig, [{round_robin: {}}]);
  assert.deepStrictEqual(config.healthCheckConfig, {serviceName: ''});
  assert.deepStrictEqual(config.methodConfig[0].retryPolicy, {
    maxAttempts: 4, initialBackoff: '0.02s', maxBackoff: '0.5s', backoffMultiplier: 2,
    retryableStatusCodes: ['UNAVAILABLE'],
  });
  assert.deepStrictEqual(config.methodConfig[0].name.slice(1).map((n) => n.method),
                         ['CreateSession', 'GetSession', 'CloseSession']);
  const options = lib.channelOptions();
  assert.deepStrictEqual(JSON.parse(options['grpc.service_config']), config);
  for (const name of ['grpc.per_rpc_retry_buffer_size', 'grpc.retry_buffer_size']) {
    assert.ok(options[name] >= options['grpc.max_send_message_length'], name);
  }
  ok('channel settings');

  const refused = {
    'http://localhost:50651': "a URL; a gRPC target is host:port: use 'localhost:50651'",
    'https://attention.example.com': "use 'attention.example.com:50051' and tls: true",
    'localhost': "no port (gRPC would use 443): give host:port, e.g. 'localhost:50051'",
    'dns:///attention': 'no port',
    '::1': 'an IPv6 address goes in brackets',
  };
  for (const [target, message] of Object.entries(refused)) {
    assert.throws(() => new lib.AttentionClient(target), (err) =>
      err instanceof lib.AttentionError && err.codeName === 'INVALID_ARGUMENT' &&
      err.message.includes(message), target);
  }
  for (const target of ['localhost:50051', 'dns:///h:1', '[::1]:5', 'ipv4:1.2.3.4:5,1.2.3.4:6',
                        'unix:/tmp/s']) {
    lib.checkTarget(target);
  }
  ok('malformed targets refused');

  const error = new lib.AttentionError(14, 'Socket closed', 'the server speaks TLS');
  assert.strictEqual(error.message, 'UNAVAILABLE: Socket closed (the server speaks TLS)');
  assert.strictEqual(error.codeName, 'UNAVAILABLE');
  assert.strictEqual(new lib.AttentionError(16, 'x').message, 'UNAUTHENTICATED: x');
  const security = lib.channelSecurity({}, {ATTENTION_TOKEN: ' node-token\n'});
  assert.strictEqual(security.tls, false);
  assert.deepStrictEqual(security.metadata.get('authorization'), ['Bearer node-token']);
  assert.strictEqual(lib.channelSecurity({tlsServerName: 'localhost'}, {}).tls, true);
  assert.throws(() => lib.channelSecurity({tlsCertFile: 'c.pem'}, {}),
                /^Error: tlsKeyFile: required with tlsCertFile/);
  assert.throws(() => lib.channelSecurity({tlsCaFile: '/nonexistent/ca.pem'}, {}),
                /^Error: tlsCaFile: cannot read '\/nonexistent\/ca.pem'/);
  assert.throws(() => lib.channelSecurity({}, {ATTENTION_TOKEN: 'two words'}),
                /^Error: ATTENTION_TOKEN: a bearer token is printable ASCII/);
  const bf16 = lib.toFloat32({dtype: 'bfloat16', shape: [2], data: Uint16Array.of(0x3f80, 0xc020)});
  const fp16 = lib.toFloat32({dtype: 'float16', shape: [2], data: Uint16Array.of(0x3c00, 0xc100)});
  assert.deepStrictEqual([...bf16, ...fp16], [1, -2.5, 1, -2.5]);
  ok('errors carry the status name; security options; bfloat16/float16 values');
}

async function fakeReplicaTests(lib) {
  const grpc = require('@grpc/grpc-js');
  const v1 = lib.loadProtos();
  const backends = [];
  const clients = [];
  try {
    // Requests over grpc-js's per-call retry buffer (1 MiB by default) were committed at
    // once: 1 attempt instead of maxAttempts (4).
    const failing = await fakeBackend(grpc, v1, grpc.status.UNAVAILABLE);
    backends.push(failing);
    const client = new lib.AttentionClient(failing.address, {deadlineMs: 10000, env: {}});
    clients.push(client);
    for (const seqLen of [16, 512, 2048]) {  // 16 KiB, 512 KiB and 2 MiB queries.
      failing.calls = 0;
      await assert.rejects(client.infer({query: zeros(lib, 1, seqLen, 256)}),
                           (err) => err instanceof lib.AttentionError &&
                                    err.codeName === 'UNAVAILABLE');
      assert.strictEqual(failing.calls, 4, `attempts of a ${seqLen * 1024} byte query`);
      assert.strictEqual(failing.queryBytes.at(-1), seqLen * 1024);
    }
    ok('large requests are retried');

    // The first address drains: round_robin retries on the next replica.
    const draining = await fakeBackend(grpc, v1, grpc.status.UNAVAILABLE);
    const serving = await fakeBackend(grpc, v1);
    backends.push(draining, serving);
    const balanced = new lib.AttentionClient(`ipv4:${draining.address},${serving.address}`,
                                             {env: {}});
    clients.push(balanced);
    for (let i = 0; i < 8; ++i) {
      const r = await balanced.infer({query: zeros(lib, 1, 2, 256), requestId: `r${i}`});
      assert.strictEqual(r.requestId, `r${i}`);
    }
    assert.strictEqual(serving.calls, 8);
    ok(`a draining replica is retried around (it got ${draining.calls} attempts)`);

    // On plaintext the token goes as per-call metadata, on every call.
    const tokened = new lib.AttentionClient(serving.address, {token: 'node-token'});
    clients.push(tokened);
    await tokened.infer({query: zeros(lib, 1, 2, 256)});
    await tokened.infer({query: zeros(lib, 1, 2, 256)});
    assert.deepStrictEqual(serving.authorization.slice(-3),
                           [[], ['Bearer node-token'], ['Bearer node-token']]);
    ok('the token as per-call metadata on plaintext');

    // waitReady() notices a server that starts listening 1.5 s in (a fresh connection per
    // poll); the delay is printed, not asserted.
    const port = await freePort();
    const late = new lib.AttentionClient(`127.0.0.1:${port}`, {env: {}});
    clients.push(late);
    await assert.rejects(late.health(), (err) => err.codeName === 'UNAVAILABLE');
    const lateServer = new grpc.Server();
    backends.push({server: lateServer});
    let startedAt = 0;
    lateServer.addService({Check: {path: '/grpc.health.v1.Health/Check', requestStream: false,
                                   responseStream: false, requestDeserialize: (b) => b,
                                   responseSerialize: (b) => b, requestSerialize: (b) => b,
                                   responseDeserialize: (b) => b}},
                          {Check: (_call, callback) => callback(null, Buffer.from([8, 1]))});
    setTimeout(() => lateServer.bindAsync(`127.0.0.1:${port}`,
                                          grpc.ServerCredentials.createInsecure(), () => {
                                            startedAt = Date.now();
                                          }), 1500);
    assert.strictEqual(await late.waitReady(5000), true);
    console.log(`  waitReady noticed the server ${Date.now() - startedAt} ms after it started`);
    assert.strictEqual(await late.health(), 'SERVING');
    const nothing = new lib.AttentionClient(`127.0.0.1:${await freePort()}`, {env: {}});
    clients.push(nothing);
    assert.strictEqual(await nothing.waitReady(300), false);
    ok('waitReady');
  } finally {
    for (const client of clients) client.close();
    for (const backend of backends) backend.server.forceShutdown();
  }
}

// A grpc-js server whose first `cuts` InferStreams each answer `answer` requests, read one more
// and end with UNAVAILABLE without answering it; later streams answer everything. Records the
// request ids every stream read.
async function fakeCutter(grpc, v1, cuts, answer) {
  const cutter = {streams: []};
  cutter.server = new grpc.Server();
  cutter.server.addService(v1.AttentionService.service, {
    InferStream: (call) => {
      const seen = [];
      cutter.streams.push(seen);
      const cut = cutter.streams.length <= cuts;
      let ended = false;
      call.on('data', (request) => {
        if (ended) return;
        seen.push(request.request_id);
        if (cut && seen.length > answer) {
          ended = true;
          call.emit('error', {code: grpc.status.UNAVAILABLE, details: 'connection closed (test)'});
          return;
        }
        call.write({request_id: request.request_id});
      });
      call.on('end', () => {
        if (!ended) call.end();
      });
    },
  });
  const port = await new Promise((resolve, reject) => {
    cutter.server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(),
                            (err, p) => (err ? reject(err) : resolve(p)));
  });
  cutter.address = `127.0.0.1:${port}`;
  return cutter;
}

// inferStream survives the server closing it: the requests a closed stream read but did not
// answer go first on the next one, and each request is answered once.
async function reopenTests(lib) {
  const grpc = require('@grpc/grpc-js');
  const cutter = await fakeCutter(grpc, lib.loadProtos(), 2, 2);
  const client = new lib.AttentionClient(cutter.address, {lbPolicy: 'pick_first', env: {}});
  try {
    const ids = [];
    const requests = Array.from({length: 8}, () => ({query: zeros(lib, 1, 2, 8)}));
    for await (const r of client.inferStream(requests)) ids.push(r.requestId);
    assert.deepStrictEqual(ids.map(Number).sort((a, b) => a - b), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert.strictEqual(cutter.streams.length, 3);
    assert.deepStrictEqual(cutter.streams[0].slice(0, 3), ['0', '1', '2']);
    assert.strictEqual(cutter.streams[1][0], '2');
    assert.strictEqual(cutter.streams[2][0], cutter.streams[1][2]);
    ok('inferStream: a stream the server closed is reopened, unanswered requests sent again');
  } finally {
    client.close();
    cutter.server.forceShutdown();
  }
}

// Against a server whose connections live 0.2 s + 0.1 s (GOAWAY, then closed under the streams
// still open): a paced inferStream of 1.2 s or more is cut at least three times, and every
// request is answered once, as a unary call answers it.
async function cutStreamTests(lib, target) {
  const client = new lib.AttentionClient(target, {deadlineMs: 60000, env: {}});
  try {
    assert.strictEqual(await client.waitReady(30000), true);
    const queries = Array.from({length: 30}, (_, i) => randn(lib, 1 + i % 2, 3, 256));
    async function* paced() {
      for (const query of queries) {
        await new Promise((r) => setTimeout(r, 40));
        yield {query};
      }
    }
    const results = [];
    for await (const r of client.inferStream(paced())) results.push(r);
    assert.deepStrictEqual(results.map((r) => Number(r.requestId)).sort((a, b) => a - b),
                           queries.map((_, i) => i));
    for (const r of results) {
      assert.strictEqual(r.error, null);
      const want = await client.infer({query: queries[Number(r.requestId)]});
      assert.ok(maxDiff(r.output.data, want.output.data) < 1e-6);
    }
    ok('inferStream: streams cut by the connection age are reopened transparently');
  } finally {
    client.close();
  }
}

async function liveTests(lib, target, smallTarget) {
  const client = new lib.AttentionClient(target, {env: {}});
  try {
    assert.strictEqual(await client.waitReady(30000), true);
    const models = await client.models();
    assert.deepStrictEqual(models.map((m) => [m.name, m.embedDim, m.numHeads, m.isDefault]),
                           [['demo', 256, 8, true]]);
    const q = randn(lib, 1, 6, 256);
    const r = await client.infer({query: q, isCausal: true, needWeights: true, requestId: 'a'});
    assert.deepStrictEqual([r.requestId, r.output.shape, r.attnWeights.shape],
                           ['a', [1, 6, 256], [1, 6, 6]]);
    assert.ok(r.batchRequests >= 1);
    const half = await client.infer({query: q, isCausal: true, outputDtype: 'bfloat16'});
    assert.strictEqual(half.output.dtype, 'bfloat16');
    assert.ok(maxDiff(lib.toFloat32(half.output), r.output.data) < 3e-2);
    await assert.rejects(client.infer({query: randn(lib, 1, 4, 100)}), (err) =>
      err.codeName === 'INVALID_ARGUMENT' &&
      err.message.includes('query: expected shape [*, *, 256], got [1, 4, 100]'));
    ok('infer');

    const requests = [{query: q, isCausal: true, requestId: 's0'},
                      {query: randn(lib, 1, 3, 100), requestId: 'bad'}, {query: q}];
    const streamed = {};
    for await (const s of client.inferStream(requests)) streamed[s.requestId] = s;
    assert.deepStrictEqual(Object.keys(streamed).sort(), ['2', 'bad', 's0']);
    assert.strictEqual(streamed.bad.error.codeName, 'INVALID_ARGUMENT');
    assert.strictEqual(streamed.bad.output, null);
    assert.ok(maxDiff(streamed.s0.output.data, r.output.data) < 1e-6);
    ok('inferStream: a result per request, a failed one with its error');

    // A session equals the causal Infer; a ReplayingSession recovers a lost session.
    const x = randn(lib, 9, 256);
    const want = (await client.infer({query: x, isCausal: true})).output.data;
    // Every session call carries its routing key (x-attention-session): a fresh key per creation
    // and the id's key on every later call; appends carry expected_length.
    const calls = [];
    const unary = client._unary.bind(client);
    client._unary = (stub, method, request, routingKey) => {
      calls.push({method, routingKey, request});
      return unary(stub, method, request, routingKey);
    };
    const session = await client.session({replay: true});
    const rows = [];
    const slice = (from, to) => lib.float32(x.data.slice(from * 256, to * 256), [to - from, 256]);
    rows.push((await session.append(slice(0, 4))).output.data);
    assert.ok(session.sessionId.endsWith(`@${target}`), session.sessionId);
    const lost = session.sessionId;
    assert.ok(await client.closeSession(lost) > 0);  // Behind its back.
    rows.push((await session.append(slice(4, 5))).output.data);
    assert.strictEqual(session.recoveries, 1);
    assert.notStrictEqual(session.sessionId, lost);
    rows.push((await session.append(slice(5, 9))).output.data);
    assert.strictEqual((await session.info()).length, 9);
    assert.ok(await session.close() > 0);
    client._unary = unary;
    const creates = calls.filter((c) => c.method === 'CreateSession').map((c) => c.routingKey);
    assert.strictEqual(creates.length, 2, JSON.stringify(calls.map((c) => c.method)));
    for (const key of creates) assert.match(key, /^[0-9a-f]{32}$/);
    assert.notStrictEqual(creates[0], creates[1], 'a re-created session draws a fresh key');
    assert.strictEqual(lib.routingKeyOf(lost), creates[0]);
    assert.strictEqual(lib.routingKeyOf(session.sessionId), creates[1]);
    for (const c of calls.filter((c) => c.method !== 'CreateSession')) {
      assert.strictEqual(c.routingKey, lib.routingKeyOf(c.request.session_id), c.method);
      assert.ok(c.routingKey, `${c.method} without a routing key`);
    }
    const appends = calls.filter((c) => c.method === 'Append');
    assert.deepStrictEqual(appends.map((c) => Number(c.request.expected_length)),
                           [0, 4, 0, 4, 5],  // The lost append, the replay, its retry.
                           'expected_length: the length before each append');
    assert.strictEqual(lib.ROUTING_HEADER, 'x-attention-session');
    const got = Float32Array.from(rows.flatMap((row) => Array.from(row)));
    assert.ok(maxDiff(got, want) < 1e-5);
    const plain = await client.session();
    await plain.append(slice(0, 2));
    await client.closeSession(plain.sessionId);
    await assert.rejects(plain.append(slice(2, 3)), (err) => err.codeName === 'NOT_FOUND');
    ok('sessions: equal to causal Infer; replay after a loss; NOT_FOUND for a plain one; ' +
       'routing keys and expected_length on every call');
  } finally {
    client.close();
  }

  // Message limits: the server's (1 MiB on smallTarget) and the client's own.
  const small = new lib.AttentionClient(smallTarget, {env: {}});
  const limited = new lib.AttentionClient(target, {maxMessageBytes: 1 << 20, env: {}});
  try {
    await assert.rejects(small.infer({query: zeros(lib, 1, 2048, 256)}), (err) =>
      err.codeName === 'RESOURCE_EXHAUSTED' &&
      /over the server's limit of 1048576: .*--max_message_bytes=\d+ or more/.test(err.hint));
    await assert.rejects(limited.infer({query: zeros(lib, 1, 2048, 256)}), (err) =>
      err.codeName === 'RESOURCE_EXHAUSTED' &&
      /over this client's limit of 1048576( bytes)?: raise maxMessageBytes/.test(err.hint));
    ok('messages over a limit name max_message_bytes');
  } finally {
    small.close();
    limited.close();
  }

  // The examples, run from the package's examples/ folder.
  const example = await run([path.join(EXAMPLES, 'example.js'), target]);
  assert.strictEqual(example.code, 0, example.stderr);
  assert.match(example.stdout, /output shape \[1, 8, 256\] float32/);
  const session = await run([path.join(EXAMPLES, 'session_example.js'), target]);
  assert.strictEqual(session.code, 0, session.stderr);
  assert.match(session.stdout, new RegExp(`session [0-9a-f]{32}\\.[0-9a-f]{32}@${target.replace(/\./g, '\\.')} \\(self\\)`));
  for (let i = 0; i < 8; ++i) {
    assert.match(session.stdout, new RegExp(`append ${i}: length ${i + 1}, output \\[1, 256\\]`));
  }
  assert.match(session.stdout, /^final length 8, keys 8, [1-9]\d* bytes held$/m);
  assert.match(session.stdout, /^closed: [1-9]\d* bytes freed$/m);
  const help = await run([path.join(EXAMPLES, 'example.js'), '--help']);
  assert.strictEqual(help.code, 0);
  assert.match(help.stdout, /--tls_ca_file/);
  const stray = await run([path.join(EXAMPLES, 'example.js'), target, 'round_robin', 'extra']);
  assert.match(stray.stderr, /unexpected argument 'extra'/);
  const url = await run([path.join(EXAMPLES, 'example.js'), 'http://localhost:50651']);
  assert.match(url.stderr, /INVALID_ARGUMENT: target 'http:\/\/localhost:50651': a URL/);
  const down = await run([path.join(EXAMPLES, 'example.js'), `127.0.0.1:${await freePort()}`]);
  assert.notStrictEqual(down.code, 0);
  assert.match(down.stderr, /attention example failed: UNAVAILABLE: /);
  ok('examples: output, --help, a stray argument, a URL, an unreachable server');
}

// Mutual TLS and a bearer token: the examples with the flags, and the hints for TLS mistakes.
async function tlsTests(lib, plainTarget) {
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
    const server = await startServer([
      `--tls_cert_file=${file('server.pem')}`, `--tls_key_file=${file('server.key')}`,
      `--tls_client_ca_file=${file('ca.pem')}`, `--auth_tokens_file=${file('tokens')}`]);
    const flags = [server.target, `--tls_ca_file=${file('ca.pem')}`,
                   `--tls_cert_file=${file('client.pem')}`, `--tls_key_file=${file('client.key')}`,
                   '--tls_server_name=localhost'];
    const {ATTENTION_TOKEN, ...noToken} = process.env;
    const clients = [];
    try {
      const mtls = new lib.AttentionClient(server.target, {
        tlsCaFile: file('ca.pem'), tlsCertFile: file('client.pem'),
        tlsKeyFile: file('client.key'), tlsServerName: 'localhost', env: {}});
      clients.push(mtls);
      assert.strictEqual(await mtls.waitReady(30000), true);
      let result = await run([path.join(EXAMPLES, 'example.js'), ...flags,
                              `--token_file=${file('token')}`], noToken);
      assert.strictEqual(result.code, 0, result.stderr);
      assert.match(result.stdout, /output shape \[1, 8, 256\] float32/);
      result = await run([path.join(EXAMPLES, 'session_example.js'), ...flags],
                         {...noToken, ATTENTION_TOKEN: token});
      assert.strictEqual(result.code, 0, result.stderr);
      assert.match(result.stdout, /^final length 8, keys 8, [1-9]\d* bytes held$/m);
      result = await run([path.join(EXAMPLES, 'example.js'), ...flags], noToken);
      assert.notStrictEqual(result.code, 0, 'a call without a token must fail');
      assert.match(result.stderr, /attention example failed: UNAUTHENTICATED: /);
      ok('examples over mutual TLS with a bearer token; UNAUTHENTICATED without one');

      // A plaintext client against the TLS server, and a TLS client against a plaintext one.
      const plain = new lib.AttentionClient(server.target, {token, deadlineMs: 5000});
      clients.push(plain);
      await assert.rejects(plain.infer({query: zeros(lib, 1, 2, 256)}), (err) =>
        err.codeName === 'UNAVAILABLE' && /the server speaks TLS: pass tls: true/.test(err.hint));
      const tlsToPlain = new lib.AttentionClient(plainTarget, {tlsCaFile: file('ca.pem'),
                                                               deadlineMs: 5000, env: {}});
      clients.push(tlsToPlain);
      await assert.rejects(tlsToPlain.infer({query: zeros(lib, 1, 2, 256)}), (err) =>
        err.codeName === 'UNAVAILABLE' &&
        /the server speaks plaintext, not TLS/.test(err.hint));
      // TLS without the client certificate mutual TLS needs.
      const noCert = new lib.AttentionClient(server.target, {
        tlsCaFile: file('ca.pem'), tlsServerName: 'localhost', token, deadlineMs: 5000});
      clients.push(noCert);
      await assert.rejects(noCert.infer({query: zeros(lib, 1, 2, 256)}), (err) => {
        console.log(`  without a client certificate: ${err.message}`);
        return err.codeName === 'UNAVAILABLE' && /client certificate/.test(err.hint);
      });
      const url = await run([path.join(EXAMPLES, 'example.js'), `https://${server.target}`]);
      assert.match(url.stderr, new RegExp(`use '${server.target.replace(/\./g, '\\.')}' and tls: true`));
      ok('hints: plaintext to TLS, TLS to plaintext, no client certificate, an https URL');
    } finally {
      for (const client of clients) client.close();
      assert.strictEqual(await stopServer(server), 0, 'the TLS server exits 0 on SIGTERM');
    }
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
}

async function main() {
  let lib;
  try {
    lib = INSTALLED ? require('attention-client') : require('..');
  } catch (err) {
    const message = `the attention-client package cannot load (${err.message}); ` +
        'scripts/install_deps.sh test runs npm ci in client/node';
    if (process.env.CI || INSTALLED) throw new Error(message);
    console.log(`SKIP: ${message}`);
    return;
  }
  offlineTests(lib);
  await fakeReplicaTests(lib);
  await reopenTests(lib);
  const server = await startServer();
  const small = await startServer(['--max_message_bytes=1048576']);
  const aging = await startServer(['--max_connection_age_s=0.2',
                                   '--max_connection_age_grace_s=0.1']);
  try {
    await liveTests(lib, server.target, small.target);
    await cutStreamTests(lib, aging.target);
    await tlsTests(lib, server.target);
  } finally {
    assert.deepStrictEqual([await stopServer(server), await stopServer(small),
                            await stopServer(aging)], [0, 0, 0],
                           'attention-server exits 0 on SIGTERM');
  }
  console.log(`${passed} passed, 0 failed`);
}

main().catch((err) => {
  console.error(err.stack || err.message);
  process.exit(1);
});
