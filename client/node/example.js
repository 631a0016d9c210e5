#!/usr/bin/env node
// Node.js example client of the attention service: loads proto/attention/v1/attention.proto
// with @grpc/proto-loader, asks the default model's shape (GetModel), sends one Infer request
// with a random float32 query (1, 8, E) and prints the output's shape, the server's timing
// fields and the first values.
//
//   node client/node/example.js [TARGET]      # default localhost:50051
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'attention', 'v1', 'attention.proto');
const DEADLINE_MS = 10000;

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
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  const {attention} = grpc.loadPackageDefinition(definition);
  const client = new attention.v1.AttentionService(target, grpc.credentials.createInsecure());
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

main().catch((err) => {
  console.error(`attention example failed: ${err.code !== undefined ? `code ${err.code}: ` : ''}` +
                `${err.details || err.message}`);
  process.exit(1);
});
