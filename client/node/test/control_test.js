#!/usr/bin/env node
// node_control_test: what a new user of the Node.js client meets first (issue 38). Model control
// and versions against a live attention-server with --model_control=explicit on a repository
// written here (models() with version and versions, repositoryIndex(), loadModel(),
// unloadModel(), infer() with modelVersion and the result's modelVersion); errors that name the
// fix: nothing listening at the target (the address and a hint, not grpc-js's "No connection
// established"), an outputDtype the client cannot send (refused naming the accepted values),
// and a missing or refused token (the token and tokenFile options). Only the
// text is checked; nothing is timed. ATTENTION_SERVER_BINARY names the server.
'use strict';
const assert = require('assert');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const {spawn} = require('child_process');

const SERVER = process.env.ATTENTION_SERVER_BINARY ||
    path.join(__dirname, '..', '..', '..', 'build', 'bin', 'attention-server');

function freePort() {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const {port} = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function startServer(flags) {
  const port = await freePort();
  const server = spawn(SERVER, ['--host=127.0.0.1', `--port=${port}`, '--metrics_port=0',
                                '--http_port=0', ...flags],
                       {stdio: ['ignore', 'ignore', 'inherit']});
  server.exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));
  server.target = `127.0.0.1:${port}`;
  return server;
}

// A torch.nn.MultiheadAttention(e, heads) layer's folder: model.safetensors (deterministic
// float32 weights) and config.json.
function writeModel(dir, e, heads, seed) {
  fs.mkdirSync(dir, {recursive: true});
  const shapes = {'in_proj_weight': [3 * e, e], 'in_proj_bias': [3 * e],
                  'out_proj.weight': [e, e], 'out_proj.bias': [e]};
  const header = {};
  const parts = [];
  let offset = 0;
  for (const [name, shape] of Object.entries(shapes)) {
    const n = shape.reduce((a, b) => a * b, 1);
    const values = Float32Array.from({length: n}, (_, i) => 0.1 * Math.sin(seed + i * 0.7));
    header[name] = {dtype: 'F32', shape, data_offsets: [offset, offset + 4 * n]};
    parts.push(Buffer.from(values.buffer));
    offset += 4 * n;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(json.length));
  fs.writeFileSync(path.join(dir, 'model.safetensors'),
                   Buffer.concat([length, Buffer.from(json), ...parts]));
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({num_heads: heads}));
}

let passed = 0;
function ok(what) {
  passed += 1;
  console.log(`ok: ${what}`);
}

async function errorTests(lib) {
  // Nothing listens at a free port: the message names the address, and the hint what to do.
  const port = await freePort();
  const down = new lib.AttentionClient(`127.0.0.1:${port}`, {env: {}, deadlineMs: 5000});
  try {
    await assert.rejects(down.models(), (err) => {
      assert.strictEqual(err.codeName, 'UNAVAILABLE');
      assert.strictEqual(err.message.split(' (')[0],
                         `UNAVAILABLE: cannot connect to 127.0.0.1:${port}: connection refused`);
      assert.match(err.hint, new RegExp(`^nothing is listening at 127\\.0\\.0\\.1:${port}\\? ` +
                                        'start attention-server there'));
      assert.doesNotMatch(err.message, /No connection established|Resolution note/);
      assert.match(err.details, /ECONNREFUSED/);  // gRPC's own text stays in details.
      return true;
    });
    // An outputDtype the client cannot send is refused before any call, naming the option
    // and the accepted values (it was sent as unset and answered in float32).
    const query = lib.float32(new Float32Array(4), [1, 1, 4]);
    for (const bad of ['float64', 'bool', 'fp16', 3]) {
      await assert.rejects(down.infer({query, outputDtype: bad}), (err) => {
        assert.ok(err instanceof TypeError, String(err));
        assert.strictEqual(err.message, `outputDtype: expected 'float32', 'bfloat16' or ` +
                                        `'float16', got ${JSON.stringify(bad)}`);
        return true;
      });
    }
  } finally {
    down.close();
  }
  ok('nothing listening: the address and a hint, not grpc-js\'s text; an unknown outputDtype ' +
     'is refused naming the accepted values');

  // A server that wants a token: the hint names the options that give one.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attention-node-control-'));
  const digest = require('crypto').createHash('sha256').update('s3cret').digest('hex');
  fs.writeFileSync(path.join(dir, 'tokens'), `${digest} node-test *\n`);
  const server = await startServer([`--auth_tokens_file=${path.join(dir, 'tokens')}`]);
  const clients = [new lib.AttentionClient(server.target, {env: {}}),
                   new lib.AttentionClient(server.target, {token: 'guess', env: {}}),
                   new lib.AttentionClient(server.target, {token: 's3cret', env: {}})];
  try {
    assert.strictEqual(await clients[2].waitReady(30000), true);
    await assert.rejects(clients[0].models(), (err) => err.codeName === 'UNAUTHENTICATED' &&
        /pass the option token: '<token>' or tokenFile: '<file>'.*ATTENTION_TOKEN/.test(err.hint));
    await assert.rejects(clients[1].models(), (err) => err.codeName === 'UNAUTHENTICATED' &&
        /refused this client's bearer token \(the token or tokenFile option/.test(err.hint));
    assert.strictEqual((await clients[2].models()).length, 1);
    ok('UNAUTHENTICATED: the hint names the token and tokenFile options');
  } finally {
    for (const client of clients) client.close();
    server.kill('SIGTERM');
    assert.strictEqual(await server.exited, 0);
    fs.rmSync(dir, {recursive: true, force: true});
  }
}

async function controlTests(lib) {
  const repo = fs.mkdtempSync(path.join(os.tmpdir(), 'attention-node-repo-'));
  writeModel(path.join(repo, 'm', '1'), 16, 2, 1);
  writeModel(path.join(repo, 'm', '2'), 16, 2, 2);
  const server = await startServer([`--model_repository=${repo}`, '--model_control=explicit']);
  const client = new lib.AttentionClient(server.target, {env: {}});
  try {
    assert.strictEqual(await client.waitReady(30000), true);
    writeModel(path.join(repo, 'late', '3'), 16, 2, 3);  // Loaded on request only.
    const models = await client.models();
    assert.deepStrictEqual(models.map((m) => [m.name, m.version, m.versions, m.batchFirst]),
                           [['m', 2, [{version: 2, state: 'READY', reason: ''}], true]]);
    assert.strictEqual((await client.getModel('m', 2)).version, 2);
    assert.deepStrictEqual(await client.repositoryIndex(),
                           [{name: 'm', version: 2, state: 'READY', reason: ''}]);

    assert.deepStrictEqual(await client.loadModel('late'), [3]);
    const query = lib.float32(new Float32Array(2 * 16).fill(0.5), [1, 2, 16]);
    const r = await client.infer({query, model: 'late', modelVersion: 3});
    assert.deepStrictEqual([r.output.shape, r.modelVersion], [[1, 2, 16], 3]);
    assert.strictEqual((await client.infer({query, model: 'm'})).modelVersion, 2);
    await assert.rejects(client.infer({query, model: 'm', modelVersion: 1}),
                         (err) => err.codeName === 'NOT_FOUND');
    assert.throws(() => lib.inferRequest({query, modelVersion: -1}),
                  /modelVersion: expected a whole number >= 0/);
    const session = await client.session({model: 'late'});
    assert.strictEqual(session.created.modelVersion, 3);
    const step = await session.append(lib.float32(new Float32Array(16), [1, 16]));
    assert.strictEqual(step.modelVersion, 3);
    await session.close();

    await client.unloadModel('late');
    assert.deepStrictEqual((await client.models()).map((m) => m.name), ['m']);
    const index = await client.repositoryIndex();
    assert.deepStrictEqual(index.map((m) => [m.name, m.state]),
                           [['late', 'UNAVAILABLE'], ['m', 'READY']]);
    assert.deepStrictEqual(await client.repositoryIndex(true),
                           [{name: 'm', version: 2, state: 'READY', reason: ''}]);
    await assert.rejects(client.unloadModel('late'), (err) => err.codeName === 'NOT_FOUND');
    await assert.rejects(client.loadModel(''), TypeError);
    ok('models() versions; repositoryIndex(); loadModel(); infer and sessions with ' +
       'modelVersion; unloadModel()');
  } finally {
    client.close();
    server.kill('SIGTERM');
    assert.strictEqual(await server.exited, 0);
    fs.rmSync(repo, {recursive: true, force: true});
  }
}

async function main() {
  let lib;
  try {
    lib = require('..');
  } catch (err) {
    const message = `the attention-client package cannot load (${err.message}); ` +
        'scripts/install_deps.sh test runs npm ci in client/node';
    if (process.env.CI) throw new Error(message);
    console.log(`SKIP: ${message}`);
    process.exit(77);
  }
  await errorTests(lib);
  await controlTests(lib);
  console.log(`${passed} passed, 0 failed`);
}

main().catch((err) => {
  console.error(err.stack || err.message);
  process.exit(1);
});
