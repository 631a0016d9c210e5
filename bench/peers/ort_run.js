#!/usr/bin/env node
// Times one ONNX model under ONNX Runtime's CPU execution provider (onnxruntime-node).
// Driven by peer_bench.py; runs one configuration per process:
//
//   node ort_run.js --model m.onnx --input x.bin --shape N,L,E --threads 2 \
//       --iterations 30 [--min_iterations 3 --budget_s 3] --warmup 3 [--output y.bin]
//
// x.bin / y.bin are raw little-endian float32 (N*L*E values). Session options: intraOpNumThreads
// = --threads, interOpNumThreads 1, sequential execution, graph optimisation level "all". Only
// session.run is timed, after the warmup runs: --iterations calls, or fewer (at least
// --min_iterations) once --budget_s seconds of timed calls have passed. Prints one JSON line:
// median_ms, min_ms, iterations, ...
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function parseArgs(argv) {
  const args = { threads: 2, iterations: 30, warmup: 3, min_iterations: 0, budget_s: 0 };
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z_]+)(?:=(.*))?$/.exec(argv[i]);
    if (!m) throw new Error(`unexpected argument '${argv[i]}'`);
    args[m[1]] = m[2] !== undefined ? m[2] : argv[++i];
  }
  for (const k of ['model', 'input', 'shape']) {
    if (!args[k]) throw new Error(`--${k} is required`);
  }
  return args;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const shape = args.shape.split(',').map(Number);
  const threads = Number(args.threads);
  const iterations = Number(args.iterations);
  const warmup = Number(args.warmup);
  const minIterations = Number(args.min_iterations) || iterations;
  const budgetMs = Number(args.budget_s) * 1e3;
  const buf = fs.readFileSync(args.input);
  const count = shape.reduce((a, b) => a * b, 1);
  if (buf.length !== 4 * count) throw new Error(`${args.input}: ${buf.length} bytes, want ${4 * count}`);
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
  const session = await ort.InferenceSession.create(args.model, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  });
  const feeds = { x: new ort.Tensor('float32', data, shape) };
  let out;
  for (let i = 0; i < warmup; i++) out = await session.run(feeds);
  const times = [];
  let spent = 0;
  for (let i = 0; i < iterations; i++) {
    if (budgetMs > 0 && i >= minIterations && spent >= budgetMs) break;
    const t0 = process.hrtime.bigint();
    out = await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    spent += times[times.length - 1];
  }
  if (args.output) {
    const y = out.y.data;
    fs.writeFileSync(args.output, Buffer.from(y.buffer, y.byteOffset, y.byteLength));
  }
  const sorted = [...times].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const median = sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  console.log(JSON.stringify({
    system: 'onnxruntime', version: ort.env.versions.node || ort.env.versions.common,
    threads, iterations: times.length, warmup, median_ms: median, min_ms: sorted[0],
  }));
  await session.release();
}

main().catch((e) => {
  console.error(`ort_run: ${e.message || e}`);
  process.exit(1);
});
