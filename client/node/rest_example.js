#!/usr/bin/env node
// One inference over the KServe v2 REST protocol with Node's built-in fetch
// (Node 18+), no packages:
//
//   node client/node/rest_example.js [--url http://localhost:8000] [--model demo]
//       [--token TOKEN] [--binary]
//
// Sends a random query [1, 4, E] (E from the model's metadata) as JSON, or
// with --binary as Triton's binary tensor extension (float32 bytes after the
// JSON header, Inference-Header-Content-Length), and prints the output's
// shape and first values as one JSON line. Errors: the HTTP status and the
// server's {"error": "..."}.
'use strict';

function parseArgs(argv) {
  const args = {url: 'http://localhost:8000', model: 'demo', token: null, binary: false};
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === '--binary') args.binary = true;
    else if (a === '--help' || a === '-h') args.help = true;
    else if (['--url', '--model', '--token'].includes(a)) args[a.slice(2)] = argv[++i];
    else throw new Error(`unknown argument '${a}' (see --help)`);
  }
  return args;
}

async function infer(url, model, query, shape, {token = null, binary = false} = {}) {
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  const input = {name: 'query', datatype: 'FP32', shape};
  let body;
  if (binary) {
    const raw = Buffer.from(new Float32Array(query).buffer);
    input.parameters = {binary_data_size: raw.length};
    const header = Buffer.from(JSON.stringify({
      inputs: [input], outputs: [{name: 'output', parameters: {binary_data: true}}]}));
    body = Buffer.concat([header, raw]);
    headers['Content-Type'] = 'application/octet-stream';
    headers['Inference-Header-Content-Length'] = String(header.length);
  } else {
    input.data = query;
    body = JSON.stringify({inputs: [input]});
    headers['Content-Type'] = 'application/json';
  }
  const res = await fetch(`${url}/v2/models/${model}/infer`, {method: 'POST', headers, body});
  const payload = Buffer.from(await res.arrayBuffer());
  if (!res.ok) return {status: res.status, error: JSON.parse(payload.toString()).error};
  const length = res.headers.get('inference-header-content-length');
  if (length === null) {
    const response = JSON.parse(payload.toString());
    return {status: res.status, response, output: response.outputs[0].data};
  }
  const response = JSON.parse(payload.subarray(0, Number(length)).toString());
  const raw = payload.subarray(Number(length));
  const output = Array.from(new Float32Array(raw.buffer.slice(
      raw.byteOffset, raw.byteOffset + raw.length)));
  return {status: res.status, response, output};
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.help) {
    console.log('usage: rest_example.js [--url URL] [--model NAME] [--token TOKEN] [--binary]');
    return 0;
  }
  const headers = args.token ? {Authorization: `Bearer ${args.token}`} : {};
  const meta = await fetch(`${args.url}/v2/models/${args.model}`, {headers});
  if (!meta.ok) {
    console.error(`metadata: HTTP ${meta.status}: ${(await meta.json()).error}`);
    return 1;
  }
  const embedDim = (await meta.json()).inputs[0].shape[2];
  const query = Array.from({length: 4 * embedDim}, (_, i) => Math.sin(i));
  const result = await infer(args.url, args.model, query, [1, 4, embedDim], args);
  if (result.status !== 200) {
    console.error(`infer: HTTP ${result.status}: ${result.error}`);
    return 1;
  }
  console.log(JSON.stringify({
    model_name: result.response.model_name, shape: result.response.outputs[0].shape,
    first: result.output.slice(0, 4)}));
  return 0;
}

module.exports = {infer};
if (require.main === module) {
  main().then((code) => process.exit(code), (e) => {
    console.error(e.message);
    process.exit(1);
  });
}
