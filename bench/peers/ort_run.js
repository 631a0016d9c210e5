#!/usr/bin/env node
// Times one ONNX model under ONNX Runtime's CPU execution provider (onnxruntime-node).
// Driven by peer_bench.py and gqa_decode.py; runs one configuration per process:
//
//   node ort_run.js --model m.onnx --input x.bin --shape N,L,E --threads 2 \
//       --iterations 30 [--min_iterations 3 --budget_s 3] --warmup 3 [--output y.bin]
//
// x.bin / y.bin are raw little-endian float32 (N*L*E values): the single input "x", the output
// "y". Models with several inputs name each one instead (repeatable options):
//
//   --feed NAME:DTYPE:DIMS:FILE     input NAME, DTYPE float32|int32|int64, DIMS comma-separated
//                                   (empty for a scalar: "t:int32::t.bin"), raw little-endian
//   --output_buffer NAME:DTYPE:DIMS pre-allocate output NAME (zeroed) once; ORT writes into it
//   --output_alias OUT=FEED         pre-allocate output OUT as FEED's own tensor (the same memory:
//                                   e.g. GroupQueryAttention's present_key=past_key, which ORT
//                                   then updates in place instead of copying the past)
//   --save_output NAME:FILE         after the last run, write output NAME raw to FILE
//   --fetch NAME                    fetch only these outputs (and the two above; default: all)
//   --profile PREFIX                ORT's profiler on (enableProfiling); the JSON gains
//                                   "profile": ORT's own median time per timed run ("model_run",
//                                   inside ORT: no JS/native conversion) and per op type (the
//                                   sum of that op's kernel times in a run). The trace file
//                                   PREFIX_*.json is removed unless --keep_profile 1.
//
// Every other output is left for ORT to allocate on each run. Input tensors wrap the file's data
// (read once, before timing); onnxruntime-node hands their memory to ORT without a copy, which
// the JSON reports for each --output_alias ("alias_written": the feed's bytes changed after the
// first run, i.e. ORT wrote into the JS buffer itself).
//
// Session options: intraOpNumThreads = --threads, interOpNumThreads 1, sequential execution,
// graph optimisation level "all". Only session.run is timed, after the warmup runs: --iterations
// calls, or fewer (at least --min_iterations) once --budget_s seconds of timed calls have
// passed. Prints one JSON line: median_ms, min_ms, iterations, minor_faults_per_run (page faults
// of the whole process during the timed runs, per run: fresh memory touched per run), ...
'use strict';
const fs = require('fs');
const crypto = require('crypto');
const ort = require('onnxruntime-node');

const REPEATABLE = new Set(['feed', 'fetch', 'output_buffer', 'output_alias', 'save_output']);
const ARRAYS = { float32: Float32Array, int32: Int32Array, int64: BigInt64Array };

function parseArgs(argv) {
  const args = { threads: 2, iterations: 30, warmup: 3, min_iterations: 0, budget_s: 0 };
  for (const k of REPEATABLE) args[k] = [];
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z_]+)(?:=(.*))?$/.exec(argv[i]);
    if (!m) throw new Error(`unexpected argument '${argv[i]}'`);
    const value = m[2] !== undefined ? m[2] : argv[++i];
    if (value === undefined) throw new Error(`--${m[1]} needs a value`);
    if (REPEATABLE.has(m[1])) args[m[1]].push(value);
    else args[m[1]] = value;
  }
  if (!args.model) throw new Error('--model is required');
  if (args.input || args.shape) {
    if (!args.input || !args.shape) throw new Error('--input and --shape go together');
    args.feed.push(`x:float32:${args.shape}:${args.input}`);
    if (args.output) args.save_output.push(`y:${args.output}`);
  }
  if (!args.feed.length) throw new Error('--input/--shape or at least one --feed is required');
  return args;
}

function parseDims(text) {
  return text === '' ? [] : text.split(',').map((d) => {
    const v = Number(d);
    if (!Number.isInteger(v) || v < 0) throw new Error(`bad dimension '${d}' in '${text}'`);
    return v;
  });
}

function arrayType(dtype) {
  const A = ARRAYS[dtype];
  if (!A) throw new Error(`dtype '${dtype}' not supported (one of ${Object.keys(ARRAYS)})`);
  return A;
}

// NAME:DTYPE:DIMS:FILE -> [name, ort.Tensor over the file's bytes]
function loadFeed(spec) {
  const m = /^([^:]+):([a-z0-9]+):([0-9,]*):(.+)$/.exec(spec);
  if (!m) throw new Error(`--feed '${spec}': want NAME:DTYPE:DIMS:FILE`);
  const [, name, dtype, dimsText, file] = m;
  const A = arrayType(dtype);
  const dims = parseDims(dimsText);
  const count = dims.reduce((a, b) => a * b, 1);
  const buf = fs.readFileSync(file);
  if (buf.length !== A.BYTES_PER_ELEMENT * count) {
    throw new Error(`${file} (--feed ${name}): ${buf.length} bytes, want ` +
                    `${A.BYTES_PER_ELEMENT * count} (${dtype} [${dims}])`);
  }
  // A copy into a fresh, aligned ArrayBuffer; made once, before any timing.
  const data = new A(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
  return [name, new ort.Tensor(dtype, data, dims)];
}

function digest(tensor) {
  const d = tensor.data;
  return crypto.createHash('sha1').update(new Uint8Array(d.buffer, d.byteOffset, d.byteLength))
      .digest('hex');
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

// Ends ORT's profiler and summarises the last `runs` model_run events of its trace (µs -> ms).
function readProfile(session, prefix, runs, keep) {
  session.endProfiling();
  const path = require('path');
  const dir = path.dirname(prefix) || '.';
  const base = path.basename(prefix);
  const files = fs.readdirSync(dir).filter((f) => f.startsWith(base + '_') && f.endsWith('.json'))
      .map((f) => path.join(dir, f))
      .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
  if (!files.length) return { error: `no profile ${prefix}_*.json` };
  const events = JSON.parse(fs.readFileSync(files[0], 'utf8'));
  if (!keep) fs.unlinkSync(files[0]);
  const modelRuns =
      events.filter((e) => e.cat === 'Session' && e.name === 'model_run').slice(-runs);
  const kernels = events.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time'));
  const perOp = {};
  modelRuns.forEach((r, i) => {
    for (const k of kernels) {
      if (k.ts >= r.ts && k.ts <= r.ts + r.dur) {
        const op = (k.args && k.args.op_name) || k.name;
        (perOp[op] = perOp[op] || new Array(modelRuns.length).fill(0))[i] += k.dur / 1e3;
      }
    }
  });
  return {
    runs: modelRuns.length,
    model_run_median_ms: modelRuns.length ? median(modelRuns.map((r) => r.dur / 1e3)) : null,
    op_median_ms: Object.fromEntries(Object.entries(perOp).map(([op, v]) => [op, median(v)])),
    ...(keep ? { file: files[0] } : {}),
  };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const threads = Number(args.threads);
  const iterations = Number(args.iterations);
  const warmup = Number(args.warmup);
  const minIterations = Number(args.min_iterations) || iterations;
  const budgetMs = Number(args.budget_s) * 1e3;
  const feeds = Object.fromEntries(args.feed.map(loadFeed));
  if (args.profile) fs.mkdirSync(require('path').dirname(args.profile) || '.', { recursive: true });
  const session = await ort.InferenceSession.create(args.model, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    ...(args.profile ? { enableProfiling: true, profileFilePrefix: args.profile } : {}),
  });
  const fetches = Object.fromEntries((args.fetch.length ? args.fetch : session.outputNames)
      .map((n) => [n, null]));
  for (const spec of args.output_buffer) {
    const m = /^([^:]+):([a-z0-9]+):([0-9,]*)$/.exec(spec);
    if (!m) throw new Error(`--output_buffer '${spec}': want NAME:DTYPE:DIMS`);
    const dims = parseDims(m[3]);
    const A = arrayType(m[2]);
    fetches[m[1]] = new ort.Tensor(m[2], new A(dims.reduce((a, b) => a * b, 1)), dims);
  }
  const aliases = {};
  for (const spec of args.output_alias) {
    const [out, feed] = spec.split('=');
    if (!feeds[feed]) throw new Error(`--output_alias ${spec}: no --feed named '${feed}'`);
    fetches[out] = feeds[feed];
    aliases[out] = { feed, before: digest(feeds[feed]) };
  }
  for (const name of Object.keys(fetches)) {
    if (!session.outputNames.includes(name)) throw new Error(`the model has no output '${name}'`);
  }
  let out;
  let alias_written;
  // One session.run; returns its wall time in ms (the alias check after the first run is not
  // part of it).
  const run = async () => {
    const t0 = process.hrtime.bigint();
    out = await session.run(feeds, fetches);
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    if (!alias_written) {
      alias_written = {};
      for (const [o, a] of Object.entries(aliases)) {
        alias_written[o] = digest(feeds[a.feed]) !== a.before;
      }
    }
    return ms;
  };
  for (let i = 0; i < warmup; i++) await run();
  const times = [];
  let spent = 0;
  const faults0 = process.resourceUsage().minorPageFault;
  for (let i = 0; i < iterations; i++) {
    if (budgetMs > 0 && i >= minIterations && spent >= budgetMs) break;
    times.push(await run());
    spent += times[times.length - 1];
  }
  const faults = process.resourceUsage().minorPageFault - faults0;
  for (const spec of args.save_output) {
    const k = spec.indexOf(':');
    const name = spec.slice(0, k);
    if (!out[name]) throw new Error(`--save_output ${spec}: no output '${name}'`);
    const y = out[name].data;
    fs.writeFileSync(spec.slice(k + 1), Buffer.from(y.buffer, y.byteOffset, y.byteLength));
  }
  const result = {
    system: 'onnxruntime', version: ort.env.versions.node || ort.env.versions.common,
    threads, iterations: times.length, warmup, median_ms: median(times), min_ms: Math.min(...times),
    minor_faults_per_run: times.length ? Math.round(faults / times.length) : null,
  };
  if (Object.keys(aliases).length) result.alias_written = alias_written;
  if (args.profile) {
    result.profile = readProfile(session, args.profile, times.length, args.keep_profile === '1');
  }
  console.log(JSON.stringify(result));
  await session.release();
}

main().catch((e) => {
  console.error(`ort_run: ${e.message || e}`);
  process.exit(1);
});
