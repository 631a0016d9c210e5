#!/usr/bin/env node
// Node.js example client of the attention service: loads proto/attention/v1/attention.proto
// with @grpc/proto-loader, asks the default model's shape (GetModel), sends one Infer request
// with a random float32 query (1, 8, E) and prints the output's shape, the server's timing
// fields and the first values.
//
//   node client/node/example.js [TARGET [LB_POLICY]]   # localhost:50051 round_robin
//
// The channel is set up like attention-client's (client/cli/client_util.cc): UNAVAILABLE
// (a replica draining or gone) is retried, up to 4 attempts, for requests up to
// MAX_MESSAGE_BYTES, and round_robin spreads calls, and each retry, over every address
// of the target. test.js requires this file for makeClient() and its settings.
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'attention', 'v1', 'attention.proto');
const DEADLINE_MS = 10000;
const MAX_MESSAGE_BYTES = 256 << 20;  // The largest message sent or received.
const RETRY_POLICY = {
  maxAttempts: 4, initialBackoff: '0.02s', maxBackoff: '0.5s', backoffMultiplier: 2,
  retryableStatusCodes: ['UNAVAILABLE'],
};
const RETRIED_SESSION_METHODS = ['CreateSession', 'GetSession', 'CloseSession'];

// The service config: retries of UNAVAILABLE (computing attention has no side effects; of
// the attention.v1.SessionService calls, those without effect on a session's contents, as in
// the C++ client: never Append) and `lbPolicy` ('' for gRPC's default, pick_first, which
// retries on the same replica).
// round_robin gets client-side health checking (healthCheckConfig) as in the C++ client;
// note that @grpc/grpc-js (1.14) ignores healthCheckConfig, so there a draining replica is
// still picked, and its UNAVAILABLE answer retried on the next replica.
function serviceConfig(lbPolicy = 'round_robin') {
  const sessionMethods = RETRIED_SESSION_METHODS.map(
      (method) => ({service: 'attention.v1.SessionService', method}));
  const config = {
    methodConfig: [{name: [{service: 'attention.v1.AttentionService'}, ...sessionMethods],
      retryPolicy: RETRY_POLICY}],
  };
  if (lbPolicy) config.loadBalancingConfig = [{[lbPolicy]: {}}];
  if (lbPolicy === 'round_robin') config.healthCheckConfig = {serviceName: ''};
  return config;
}

function channelOptions(lbPolicy = 'round_robin') {
  return {
    'grpc.service_config': JSON.stringify(serviceConfig(lbPolicy)),
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
    // grpc-js keeps at most this much of a call (1 MiB by default), and of all calls of
    // the channel (16 MiB), for retries: a larger request is committed at once and never
    // retried.
    'grpc.per_rpc_retry_buffer_size': MAX_MESSAGE_BYTES,
    'grpc.retry_buffer_size': MAX_MESSAGE_BYTES,
  };
}

function loadAttention() {
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).attention;
}

function makeClient(target, lbPolicy = 'round_robin') {
  const attention = loadAttention();
  return new attention.v1.AttentionService(target, grpc.credentials.createInsecure(),
                                           channelOptions(lbPolicy));
}

function deadline() {
  return new Date(Date.now() + DEADLINE_MS);
}

function call(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, {deadline: deadline()}, (err, response) => {
      if (err) reject(err); else resolve(response);
    });
  });
}

async function main() {
  const target = process.argv[2] || 'localhost:50051';
  const client = makeClient(target, process.argv[3] ?? 'round_robin');
  try {
    const model = await call(client, 'GetModel', {name: ''});
    const e = Number(model.embed_dim);
    const l = 8;
    const query = new Float32Array(l * e);
    for (let i = 0; i < query.length; ++i) query[i] = Math.sin(i * 0.37);  // Deterministic.
    const response = await call(client, 'Infer', {
      request_id: 'node-example',
      query: {
        dtype: 'DATA_TYPE_FLOAT32',
        shape: [1, l, e],
        data: Buffer.from(query.buffer),  // Row-major little-endian float32.
      },
      is_causal: true,
    });
    const out = response.output;
    const bytes = Buffer.from(out.data);
    const values = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
    console.log(`model ${model.name}: embed_dim ${e}, num_heads ${model.num_heads}`);
    console.log(`output shape [${out.shape.join(', ')}] ${out.dtype}`);
    console.log(`server queue_us ${response.queue_us} compute_us ${response.compute_us} ` +
                `batch_requests ${response.batch_requests}`);
    console.log(`first values ${Array.from(values.slice(0, 4)).map((v) => v.toFixed(5)).join(' ')}`);
    if (values.length !== l * e || values.some((v) => !Number.isFinite(v))) {
      throw new Error(`unexpected output: ${values.length} values`);
    }
  } finally {
    client.close();
  }
}

module.exports = {
  MAX_MESSAGE_BYTES, RETRY_POLICY, RETRIED_SESSION_METHODS, serviceConfig, channelOptions,
  loadAttention, makeClient, call,
};

if (require.main === module) {
  main().catch((err) => {
    const code = err.code !== undefined ? `code ${err.code}: ` : '';
    console.error(`attention example failed: ${code}${err.details || err.message}`);
    process.exit(1);
  });
}
