#!/usr/bin/env node
// Node.js session example of the attention-client package: creates a self-attention session
// on the default model (a ReplayingSession: re-created and replayed if lost), appends 8
// random float32 tokens (1, E) one at a time (the server keeps the keys and values; each call
// sends only the new token), prints each append's length and first values, the session's
// final length (info()), and closes it.
//
//   node examples/session_example.js [TARGET [LB_POLICY]] [flags: --help]
'use strict';
const {AttentionClient, float32} = require('..');
const {parseCommandLine} = require('./cli.js');

const USAGE = 'usage: node examples/session_example.js [TARGET [LB_POLICY]] [flags]\n' +
    'Appends 8 tokens one at a time to a session on the default model, then closes it.';
const TOKENS = 8;

async function main() {
  const {target, options} = parseCommandLine(USAGE);
  const client = new AttentionClient(target, options);
  let session = null;
  try {
    const model = await client.getModel();
    const e = model.embedDim;
    session = await client.session({replay: true});
    console.log(`model ${session.model}: embed_dim ${e}; session ${session.sessionId} ` +
                `(${session.kind})`);
    for (let i = 0; i < TOKENS; ++i) {
      const token = Float32Array.from({length: e}, () => Math.random() * 2 - 1);
      const r = await session.append(float32(token, [1, e]), {requestId: `token-${i}`});
      const values = r.output.data;
      if (values.length !== e || values.some((v) => !Number.isFinite(v))) {
        throw new Error(`unexpected output: ${values.length} values`);
      }
      const first = Array.from(values.slice(0, 4)).map((v) => v.toFixed(5)).join(' ');
      console.log(`append ${i}: length ${r.length}, output [${r.output.shape.join(', ')}], ` +
                  `first values ${first} (queue_us ${r.queueUs}, compute_us ${r.computeUs})`);
    }
    const info = await session.info();
    console.log(`final length ${info.length}, keys ${info.keys}, ${info.bytes} bytes held`);
    console.log(`closed: ${await session.close()} bytes freed`);
  } finally {
    if (session && !session.closed) await session.close().catch(() => {});
    client.close();
  }
}

main().catch((err) => {
  console.error(`attention session example failed: ${err.message}`);
  process.exit(1);
});
