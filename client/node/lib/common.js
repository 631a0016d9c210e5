// attention-client's shared pieces: channel settings and security, tensors, and the message
// conversions the client classes (client.js) use; with errors.js's errors, target checks and
// hints, re-exported.
//
// The package (index.js):
//   const {AttentionClient, float32} = require('attention-client');
//   const client = new AttentionClient('localhost:50051', {tlsCaFile: 'ca.pem', tokenFile: 'token'});
//   await client.waitReady(10000);                       // true once the server is SERVING
//   const r = await client.infer({query: float32(data, [1, 8, 256]), isCausal: true});
//   r.output.shape, r.output.data (Float32Array), r.queueUs, r.computeUs, r.batchRequests
//   for await (const s of client.inferStream(requests)) s.requestId, s.error || s.output
//   const session = await client.session({replay: true});  // ReplayingSession
//   await session.append(float32(token, [1, 256])); await session.close();
//   client.close();
//
// Channels are set up like attention-client's (client/cli/client_util.cc): UNAVAILABLE is
// retried (4 attempts, requests up to maxMessageBytes), round_robin by default. A session id
// "<hex>@<address>" names the replica holding the session: its calls go there. Errors are
// AttentionError: the status name and number, the details, and a hint when the client can
// tell what to do (a TLS/plaintext mismatch, a message over a limit); a malformed target (a
// URL, no port) is refused by the constructor. index.d.ts has the types.
'use strict';
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const errors = require('./errors.js');

const {AttentionError} = errors;

const VERSION = require('../package.json').version;
const MAX_MESSAGE_BYTES = 256 << 20;  // The largest message sent or received (default).
const DEFAULT_DEADLINE_MS = 30000;
const RETRY_POLICY = {
  maxAttempts: 4, initialBackoff: '0.02s', maxBackoff: '0.5s', backoffMultiplier: 2,
  retryableStatusCodes: ['UNAVAILABLE'],
};
const RETRIED_SESSION_METHODS = ['CreateSession', 'GetSession', 'CloseSession'];

// The protos: bundled in the package (proto/, copied by `npm pack`), else the repository's.
function protoRoot() {
  const bundled = path.join(__dirname, '..', 'proto');
  if (fs.existsSync(path.join(bundled, 'attention', 'v1', 'attention.proto'))) return bundled;
  return path.join(__dirname, '..', '..', '..', 'proto');
}

let loaded = null;
// The protos' packages: attention.v1 (loadProtos()) and the Open Inference Protocol's
// inference package (loadProtos().inference: RepositoryIndex).
function loadProtos() {
  if (!loaded) {
    const definition = protoLoader.loadSync(
        ['attention/v1/attention.proto', 'attention/v1/sessions.proto',
         'inference/grpc_predict_v2.proto'],
        {keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
         includeDirs: [protoRoot()]});
    const root = grpc.loadPackageDefinition(definition);
    loaded = root.attention.v1;
    Object.defineProperty(loaded, 'inference', {value: root.inference, enumerable: false});
  }
  return loaded;
}

// ---------------------------------------------------------------------------------------------
// Channels and security.

// The service config: UNAVAILABLE retried (computing attention has no side effects; of the
// session calls those without effect on a session's contents: never Append), `lbPolicy`
// ('' for gRPC's default, pick_first). round_robin asks for client-side health checking as
// the C++ client does (grpc-js ignores healthCheckConfig: a draining replica's UNAVAILABLE
// answer is retried on the next replica instead).
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

function channelOptions(lbPolicy = 'round_robin', maxMessageBytes = MAX_MESSAGE_BYTES) {
  return {
    'grpc.service_config': JSON.stringify(serviceConfig(lbPolicy)),
    'grpc.max_send_message_length': maxMessageBytes,
    'grpc.max_receive_message_length': maxMessageBytes,
    // grpc-js keeps at most this much of a call (1 MiB by default), and of all calls of the
    // channel (16 MiB), for retries: a larger request would be committed at once.
    'grpc.per_rpc_retry_buffer_size': maxMessageBytes,
    'grpc.retry_buffer_size': maxMessageBytes,
  };
}

function readFile(option, file) {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new Error(`${option}: cannot read '${file}': ${err.message}`);
  }
}

// The bearer token: `token` if a string ('' for none), else `tokenFile`'s contents, else
// env.ATTENTION_TOKEN; whitespace around it dropped; '' when there is none.
function readToken(token, tokenFile, env = process.env) {
  let source = 'ATTENTION_TOKEN';
  let value = env.ATTENTION_TOKEN || '';
  if (typeof token === 'string') {
    source = 'token';
    value = token;
  } else if (tokenFile) {
    source = 'tokenFile';
    value = readFile('tokenFile', tokenFile).toString('utf8');
    if (!value.trim()) throw new Error(`tokenFile: '${tokenFile}' is empty`);
  }
  value = value.trim();
  if (value && !/^[\x21-\x7e]+$/.test(value)) {
    throw new Error(`${source}: a bearer token is printable ASCII without spaces`);
  }
  return value;
}

function bearerMetadata(token) {
  const metadata = new grpc.Metadata();
  if (token) metadata.set('authorization', `Bearer ${token}`);
  return metadata;
}

// How channels reach the server: {tls, credentials, options, metadata (sent with every call:
// the token on plaintext, where grpc-js refuses call credentials)}.
function channelSecurity(opts = {}, env = process.env) {
  if (opts.tlsCertFile && !opts.tlsKeyFile) {
    throw new Error('tlsKeyFile: required with tlsCertFile (a client certificate needs its ' +
                    'private key)');
  }
  if (opts.tlsKeyFile && !opts.tlsCertFile) {
    throw new Error('tlsCertFile: required with tlsKeyFile (a private key needs its ' +
                    'certificate)');
  }
  const token = readToken(opts.token, opts.tokenFile, env);
  if (!(opts.tls || opts.tlsCaFile || opts.tlsCertFile || opts.tlsServerName)) {
    return {tls: false, credentials: grpc.credentials.createInsecure(), options: {},
            metadata: bearerMetadata(token), hasToken: !!token};
  }
  const read = (option) => (opts[option] ? readFile(option, opts[option]) : null);
  let credentials = grpc.credentials.createSsl(read('tlsCaFile'), read('tlsKeyFile'),
                                               read('tlsCertFile'));
  if (token) {
    credentials = credentials.compose(grpc.credentials.createFromMetadataGenerator(
        (_params, callback) => callback(null, bearerMetadata(token))));
  }
  const options = opts.tlsServerName ?
      {'grpc.ssl_target_name_override': opts.tlsServerName} : {};
  return {tls: true, credentials, options, metadata: new grpc.Metadata(), hasToken: !!token};
}

// ---------------------------------------------------------------------------------------------
// Tensors: {dtype: 'float32' | 'float16' | 'bfloat16' | 'bool', shape, data}. data is a
// Float32Array (float32), Uint16Array of raw words (float16, bfloat16) or Uint8Array (bool).

const DTYPES = {float32: 'DATA_TYPE_FLOAT32', bfloat16: 'DATA_TYPE_BFLOAT16',
                float16: 'DATA_TYPE_FLOAT16', bool: 'DATA_TYPE_BOOL'};
const DTYPE_NAMES = Object.fromEntries(Object.entries(DTYPES).map(([k, v]) => [v, k]));
const ARRAYS = {float32: Float32Array, float16: Uint16Array, bfloat16: Uint16Array,
                bool: Uint8Array};

// The output_dtype of an outputDtype option: unset ('' or undefined) is the server's default
// (float32); another value than 'float32', 'bfloat16' or 'float16' is a TypeError naming the
// option and the accepted values (it was sent as unset, answered in float32).
const OUTPUT_DTYPES = ['float32', 'bfloat16', 'float16'];
function outputDtypeOf(outputDtype) {
  if (outputDtype === undefined || outputDtype === null || outputDtype === '') {
    return 'DATA_TYPE_UNSPECIFIED';
  }
  if (!OUTPUT_DTYPES.includes(outputDtype)) {
    throw new TypeError(`outputDtype: expected 'float32', 'bfloat16' or 'float16', got ` +
                        `${JSON.stringify(outputDtype)}`);
  }
  return DTYPES[outputDtype];
}

function float32(data, shape) {
  return {dtype: 'float32', shape, data: Float32Array.from(data)};
}

function bool(data, shape) {
  return {dtype: 'bool', shape, data: Uint8Array.from(data, (v) => (v ? 1 : 0))};
}

function toProtoTensor(tensor, what) {
  if (!tensor || !DTYPES[tensor.dtype] || !Array.isArray(tensor.shape)) {
    throw new TypeError(`${what}: expected {dtype: 'float32'|'float16'|'bfloat16'|'bool', ` +
                        'shape: number[], data}');
  }
  const data = tensor.data;
  const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  return {dtype: DTYPES[tensor.dtype], shape: tensor.shape, data: bytes};
}

function fromProtoTensor(tensor) {
  if (!tensor || !tensor.shape || tensor.shape.length === 0) return null;
  const dtype = DTYPE_NAMES[tensor.dtype];
  const Array_ = ARRAYS[dtype];
  const copy = new Uint8Array(tensor.data);  // Aligned for the typed array.
  return {dtype, shape: tensor.shape.map(Number),
          data: new Array_(copy.buffer, 0, copy.length / Array_.BYTES_PER_ELEMENT)};
}

// float32 values of a tensor of any float dtype (bfloat16 and float16 words converted).
function toFloat32(tensor) {
  if (tensor.dtype === 'float32') return tensor.data;
  const out = new Float32Array(tensor.data.length);
  if (tensor.dtype === 'bfloat16') {
    const words = new Uint32Array(out.buffer);
    for (let i = 0; i < out.length; ++i) words[i] = tensor.data[i] << 16;
  } else if (tensor.dtype === 'float16') {
    for (let i = 0; i < out.length; ++i) {
      const h = tensor.data[i];
      const sign = h & 0x8000 ? -1 : 1;
      const exponent = (h >> 10) & 0x1f;
      const fraction = h & 0x3ff;
      out[i] = exponent === 0 ? sign * 2 ** -14 * (fraction / 1024) :
          exponent === 31 ? (fraction ? NaN : sign * Infinity) :
          sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
    }
  } else {
    out.set(tensor.data);
  }
  return out;
}

// modelVersion: a whole number >= 0 (0 or absent: the newest serving version).
function modelVersionOf(version) {
  if (version === undefined || version === null) return 0;
  if (!Number.isInteger(version) || version < 0) {
    throw new TypeError(`modelVersion: expected a whole number >= 0 (0: the newest serving ` +
                        `version), got ${JSON.stringify(version)}`);
  }
  return version;
}

function inferRequest(opts) {
  const request = {
    model: opts.model || '', request_id: opts.requestId || '',
    query: toProtoTensor(opts.query, 'query'), is_causal: !!opts.isCausal,
    need_weights: !!opts.needWeights, per_head_weights: !!opts.perHeadWeights,
    output_dtype: outputDtypeOf(opts.outputDtype),
    model_version: modelVersionOf(opts.modelVersion),
  };
  for (const [name, field] of [['key', 'key'], ['value', 'value'],
                               ['keyPaddingMask', 'key_padding_mask'],
                               ['attnMask', 'attn_mask']]) {
    if (opts[name]) request[field] = toProtoTensor(opts[name], name);
  }
  return request;
}

function inferResult(response) {
  const error = response.error && response.error.code ?
      new AttentionError(response.error.code, response.error.message) : null;
  return {
    requestId: response.request_id, output: error ? null : fromProtoTensor(response.output),
    attnWeights: error ? null : fromProtoTensor(response.attn_weights),
    queueUs: Number(response.queue_us), computeUs: Number(response.compute_us),
    batchRequests: Number(response.batch_requests), modelVersion: Number(response.model_version),
    error,
  };
}

function appendResult(response) {
  const error = response.error && response.error.code ?
      new AttentionError(response.error.code, response.error.message) : null;
  return {
    sessionId: response.session_id, requestId: response.request_id,
    output: error ? null : fromProtoTensor(response.output),
    attnWeights: error ? null : fromProtoTensor(response.attn_weights),
    length: Number(response.length), queueUs: Number(response.queue_us),
    computeUs: Number(response.compute_us), batchRequests: Number(response.batch_requests),
    modelVersion: Number(response.model_version), error,
  };
}

function sessionInfo(info) {
  return {
    sessionId: info.session_id, model: info.model,
    kind: {SESSION_KIND_SELF: 'self', SESSION_KIND_CROSS: 'cross'}[info.kind] || 'unspecified',
    length: Number(info.length), keys: Number(info.keys), bytes: Number(info.bytes),
    createdUnixMs: Number(info.created_unix_ms), lastUsedUnixMs: Number(info.last_used_unix_ms),
    ttlS: Number(info.ttl_s), maxTokens: Number(info.max_tokens),
    modelVersion: Number(info.model_version),
  };
}

// One entry of the repository index (RepositoryIndexResponse.ModelIndex): version 0 when the
// server names none.
function repositoryModel(m) {
  return {name: m.name, version: Number(m.version) || 0, state: m.state, reason: m.reason};
}

function modelInfo(m) {
  return {
    name: m.name, embedDim: Number(m.embed_dim), numHeads: Number(m.num_heads),
    kdim: Number(m.kdim), vdim: Number(m.vdim), bias: m.bias, addBiasKv: m.add_bias_kv,
    addZeroAttn: m.add_zero_attn, computeDtype: DTYPE_NAMES[m.compute_dtype] || m.compute_dtype,
    isDefault: m.is_default, version: Number(m.version),
    versions: (m.versions || []).map((v) => ({version: Number(v.version), state: v.state,
                                              reason: v.reason})),
    batchFirst: m.batch_first !== false,
    batching: {
      maxBatchSize: Number(m.batching.max_batch_size),
      maxBatchTokens: Number(m.batching.max_batch_tokens),
      maxQueueDelayUs: Number(m.batching.max_queue_delay_us),
      maxQueueSize: Number(m.batching.max_queue_size),
    },
  };
}

// grpc.health.v1 without its proto: HealthCheckRequest{service} and the response's status.
const HEALTH_STATUS = ['UNKNOWN', 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN'];
function healthRequest(service) {
  const data = Buffer.from(service || '');
  return data.length ? Buffer.concat([Buffer.from([0x0a, data.length]), data]) : Buffer.alloc(0);
}
function healthStatus(bytes) {
  return HEALTH_STATUS[bytes.length >= 2 && bytes[0] === 0x08 ? bytes[1] : 0] || 'UNKNOWN';
}

module.exports = {
  ...errors, VERSION, MAX_MESSAGE_BYTES, RETRY_POLICY, RETRIED_SESSION_METHODS, serviceConfig,
  channelOptions,
  readToken, channelSecurity, DTYPES, outputDtypeOf, float32, bool, toFloat32, toProtoTensor, fromProtoTensor,
  loadProtos, protoRoot,
  inferRequest, inferResult, appendResult, sessionInfo, modelInfo, repositoryModel,
  modelVersionOf, healthRequest, healthStatus,
};
