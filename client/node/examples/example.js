#!/usr/bin/env node
// Node.js example client of the attention service: loads proto/attention/v1/attention.proto
// with @grpc/proto-loader, asks the default model's shape (GetModel), sends one Infer request
// with a random float32 query (1, 8, E) and prints the output's shape, the server's timing
// fields and the first values.
//
//   node client/node/example.js [TARGET [LB_POLICY]]   # localhost:50051 round_robin
//       [--tls | --tls_ca_file=ca.pem] [--tls_cert_file=c.pem --tls_key_file=c.key]
//       [--tls_server_name=NAME] [--token_file=F]        # token default: $ATTENTION_TOKEN
//
// Security flags (attention-client's): --tls uses TLS with the system's roots; --tls_ca_file
// trusts those PEM roots instead; --tls_cert_file and --tls_key_file present a client
// certificate (mutual TLS); --tls_server_name is the name expected in the server's certificate
// (grpc.ssl_target_name_override); any --tls_* flag implies TLS. The bearer token (of
// --token_file, else of the environment variable ATTENTION_TOKEN) goes on every call as
// `authorization: Bearer <token>`: over TLS as call credentials composed with the channel's,
// on plaintext as per-call metadata (grpc-js refuses call credentials on insecure channels).
//
// The channel is set up like attention-client's (client/cli/client_util.cc): UNAVAILABLE
// (a replica draining or gone) is retried, up to 4 attempts, for requests up to
// MAX_MESSAGE_BYTES, and round_robin spreads calls, and each retry, over every address
// of the target. test.js requires this file for makeClient() and its settings.
const fs = require('fs');
const path = require('path');
const {parseArgs} = require('util');
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

// The command line's security flags (util.parseArgs options), as attention-client's.
const SECURITY_FLAGS = {
  tls: {type: 'boolean', default: false},
  tls_ca_file: {type: 'string'},
  tls_cert_file: {type: 'string'},
  tls_key_file: {type: 'string'},
  tls_server_name: {type: 'string'},
  token_file: {type: 'string'},
};

function readFlagFile(flag, file) {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new Error(`--${flag}: cannot read '${file}': ${err.message}`);
  }
}

// The bearer token: of `tokenFile` if set, else of env.ATTENTION_TOKEN; '' for none.
function readToken(tokenFile, env = process.env) {
  let source = 'ATTENTION_TOKEN';
  let token = env.ATTENTION_TOKEN || '';
  if (tokenFile) {
    source = '--token_file';
    token = readFlagFile('token_file', tokenFile).toString('utf8');
    if (!token.trim()) throw new Error(`--token_file: '${tokenFile}' is empty`);
  }
  token = token.trim();
  if (token && !/^[\x21-\x7e]+$/.test(token)) {
    throw new Error(`${source}: a bearer token is printable ASCII without spaces`);
  }
  return token;
}

function bearerMetadata(token) {
  const metadata = new grpc.Metadata();
  if (token) metadata.set('authorization', `Bearer ${token}`);
  return metadata;
}

// How channels reach the server, from SECURITY_FLAGS values: {tls, credentials, options (to
// add to the channel's), metadata (to send with every call: the token on plaintext)}.
function channelSecurity(flags = {}, env = process.env) {
  if (flags.tls_cert_file && !flags.tls_key_file) {
    throw new Error('--tls_key_file: required with --tls_cert_file (a client certificate ' +
                    'needs its private key)');
  }
  if (flags.tls_key_file && !flags.tls_cert_file) {
    throw new Error('--tls_cert_file: required with --tls_key_file (a private key needs its ' +
                    'certificate)');
  }
  const token = readToken(flags.token_file, env);
  if (!(flags.tls || flags.tls_ca_file || flags.tls_cert_file || flags.tls_server_name)) {
    return {tls: false, credentials: grpc.credentials.createInsecure(), options: {},
            metadata: bearerMetadata(token)};
  }
  const read = (flag) => (flags[flag] ? readFlagFile(flag, flags[flag]) : null);
  let credentials = grpc.credentials.createSsl(read('tls_ca_file'), read('tls_key_file'),
                                               read('tls_cert_file'));
  if (token) {
    credentials = credentials.compose(grpc.credentials.createFromMetadataGenerator(
        (_params, callback) => callback(null, bearerMetadata(token))));
  }
  const options = flags.tls_server_name ?
      {'grpc.ssl_target_name_override': flags.tls_server_name} : {};
  return {tls: true, credentials, options, metadata: new grpc.Metadata()};
}

// The command line of the examples: [TARGET [LB_POLICY]] and SECURITY_FLAGS, as
// {target, lbPolicy, security}. Throws on an unknown flag or a bad combination.
function parseCommandLine(args = process.argv.slice(2), env = process.env) {
  const {values, positionals} = parseArgs({args, options: SECURITY_FLAGS,
                                           allowPositionals: true});
  if (positionals.length > 2) throw new Error(`unexpected arguments: ${positionals.slice(2)}`);
  return {target: positionals[0] || 'localhost:50051', lbPolicy: positionals[1] ?? 'round_robin',
          security: channelSecurity(values, env)};
}

function loadAttention() {
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).attention;
}

// An AttentionService client; `security` from channelSecurity (default: plaintext, no token).
// Pass security.metadata to call().
function makeClient(target, lbPolicy = 'round_robin', security = channelSecurity({}, {})) {
  const attention = loadAttention();
  return new attention.v1.AttentionService(target, security.credentials,
                                           {...channelOptions(lbPolicy), ...security.options});
}

function deadline() {
  return new Date(Date.now() + DEADLINE_MS);
}

// One unary call with a deadline and `metadata` (channelSecurity's: the token on plaintext).
function call(client, method, request, metadata = new grpc.Metadata()) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata.clone(), {deadline: deadline()}, (err, response) => {
      if (err) reject(err); else resolve(response);
    });
  });
}

async function main() {
  const {target, lbPolicy, security} = parseCommandLine();
  const client = makeClient(target, lbPolicy, security);
  try {
    const model = await call(client, 'GetModel', {name: ''}, security.metadata);
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
    }, security.metadata);
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
  SECURITY_FLAGS, readToken, channelSecurity, parseCommandLine, loadAttention, makeClient, call,
};

if (require.main === module) {
  main().catch((err) => {
    const code = err.code !== undefined ? `code ${err.code}: ` : '';
    console.error(`attention example failed: ${code}${err.details || err.message}`);
    process.exit(1);
  });
}
