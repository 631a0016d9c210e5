#!/usr/bin/env node
// Node.js session example: loads proto/attention/v1/attention.proto and sessions.proto with
// @grpc/proto-loader, asks the default model's shape (GetModel), creates a self-attention
// session (CreateSession), appends 8 random float32 tokens (1, E) one at a time (Append:
// the server keeps the keys and values, each call sends only the new token), prints each
// append's length and first values, the session's final length (GetSession), and closes it
// (CloseSession).
//
//   node client/node/session_example.js [TARGET [LB_POLICY]]   # localhost:50051 round_robin
//       [--tls | --tls_ca_file=ca.pem] [--tls_cert_file=c.pem --tls_key_file=c.key]
//       [--tls_server_name=NAME] [--token_file=F]        # token default: $ATTENTION_TOKEN
//
// The channels use example.js's options (channelOptions: retries of UNAVAILABLE, except for
// Append, whose retry could apply the tokens twice) and security flags (see example.js): every
// channel, the replicas' included, gets the same credentials, and every call the token. A
// session id "<hex>@<address>" (a server run with --advertise_address) names the replica
// holding the session: its calls go to a channel to that address, as in the C++ and Python
// clients.
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const {channelOptions, call, parseCommandLine} = require('./example.js');

const PROTO_ROOT = path.join(__dirname, '..', '..', 'proto');
const TOKENS = 8;

function loadProtos() {
  const definition = protoLoader.loadSync(
      ['attention/v1/attention.proto', 'attention/v1/sessions.proto'], {
        keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
        includeDirs: [PROTO_ROOT],
      });
  return grpc.loadPackageDefinition(definition).attention;
}

// Float32 values of a Tensor message (row-major little-endian float32).
function float32Values(tensor) {
  const bytes = Buffer.from(tensor.data);
  const copy = new Uint8Array(bytes);  // Aligned for Float32Array.
  return new Float32Array(copy.buffer, 0, copy.length / 4);
}

async function main() {
  const {target, lbPolicy, security} = parseCommandLine();
  const {credentials, metadata} = security;
  const options = (policy) => ({...channelOptions(policy), ...security.options});
  const attention = loadProtos();
  const models = new attention.v1.AttentionService(target, credentials, options(lbPolicy));
  const sessions = new attention.v1.SessionService(target, credentials, options(lbPolicy));
  const replicas = new Map();  // address -> SessionService client (pick_first).
  // The client for a session's calls: the replica named after '@' in its id, else the target.
  const clientFor = (sessionId) => {
    const at = sessionId.indexOf('@');
    if (at < 0) return sessions;
    const address = sessionId.slice(at + 1);
    if (!replicas.has(address)) {
      replicas.set(address, new attention.v1.SessionService(address, credentials,
                                                            options('pick_first')));
    }
    return replicas.get(address);
  };
  let sessionId = '';
  try {
    const model = await call(models, 'GetModel', {name: ''}, metadata);
    const e = Number(model.embed_dim);
    const info = await call(sessions, 'CreateSession', {model: '', kind: 'SESSION_KIND_SELF'},
                            metadata);
    sessionId = info.session_id;
    console.log(`model ${info.model}: embed_dim ${e}; session ${sessionId} (${info.kind})`);
    for (let i = 0; i < TOKENS; ++i) {
      const token = new Float32Array(e);
      for (let j = 0; j < e; ++j) token[j] = Math.random() * 2 - 1;
      const response = await call(clientFor(sessionId), 'Append', {
        session_id: sessionId,
        request_id: `token-${i}`,
        tokens: {dtype: 'DATA_TYPE_FLOAT32', shape: [1, e], data: Buffer.from(token.buffer)},
      }, metadata);
      const values = float32Values(response.output);
      if (values.length !== e || values.some((v) => !Number.isFinite(v))) {
        throw new Error(`unexpected output: ${values.length} values`);
      }
      const first = Array.from(values.slice(0, 4)).map((v) => v.toFixed(5)).join(' ');
      console.log(`append ${i}: length ${response.length}, ` +
                  `output [${response.output.shape.join(', ')}], first values ${first} ` +
                  `(queue_us ${response.queue_us}, compute_us ${response.compute_us})`);
    }
    const final = await call(clientFor(sessionId), 'GetSession', {session_id: sessionId},
                             metadata);
    console.log(`final length ${final.length}, keys ${final.keys}, ${final.bytes} bytes held`);
    const closed = await call(clientFor(sessionId), 'CloseSession', {session_id: sessionId},
                              metadata);
    sessionId = '';
    console.log(`closed: ${closed.freed_bytes} bytes freed`);
  } finally {
    if (sessionId) {  // Failed midway: free the session (best effort).
      await call(clientFor(sessionId), 'CloseSession', {session_id: sessionId}, metadata)
          .catch(() => {});
    }
    models.close();
    sessions.close();
    for (const client of replicas.values()) client.close();
  }
}

module.exports = {loadProtos};

if (require.main === module) {
  main().catch((err) => {
    const code = err.code !== undefined ? `code ${err.code}: ` : '';
    console.error(`attention session example failed: ${code}${err.details || err.message}`);
    process.exit(1);
  });
}
