#!/usr/bin/env node
// Node.js example of the attention-client package: asks the default model's shape
// (getModel), sends one Infer request with a deterministic float32 query (1, 8, E) and prints
// the output's shape, the server's timing fields and the first values.
//
//   node examples/example.js [TARGET [LB_POLICY]] [--tls | --tls_ca_file=ca.pem]
//       [--tls_cert_file=c.pem --tls_key_file=c.key] [--tls_server_name=NAME] [--token_file=F]
'use strict';
const {AttentionClient, float32} = require('..');
const {parseCommandLine} = require('./cli.js');

const USAGE = 'usage: node examples/example.js [TARGET [LB_POLICY]] [flags]\n' +
    'Sends one Infer request (a (1, 8, E) float32 query) to the default model and prints the ' +
    'result.';

async function main() {
  const {target, options} = parseCommandLine(USAGE);
  const client = new AttentionClient(target, options);
  try {
    const model = await client.getModel();
    const l = 8;
    const values = new Float32Array(l * model.embedDim);
    for (let i = 0; i < values.length; ++i) values[i] = Math.sin(i * 0.37);  // Deterministic.
    const r = await client.infer({query: float32(values, [1, l, model.embedDim]),
                                  isCausal: true, requestId: 'node-example'});
    const out = r.output.data;
    console.log(`model ${model.name}: embed_dim ${model.embedDim}, num_heads ${model.numHeads}`);
    console.log(`output shape [${r.output.shape.join(', ')}] ${r.output.dtype}`);
    console.log(`server queue_us ${r.queueUs} compute_us ${r.computeUs} ` +
                `batch_requests ${r.batchRequests}`);
    console.log(`first values ${Array.from(out.slice(0, 4)).map((v) => v.toFixed(5)).join(' ')}`);
    if (out.length !== l * model.embedDim || out.some((v) => !Number.isFinite(v))) {
      throw new Error(`unexpected output: ${out.length} values`);
    }
  } finally {
    client.close();
  }
}

main().catch((err) => {
  console.error(`attention example failed: ${err.message}`);
  process.exit(1);
});
