// AttentionClient, Session and ReplayingSession: attention.v1 over @grpc/grpc-js, with the
// channel settings, security and errors of common.js. Promises throughout; a client is used
// from one event loop and holds its channels until close().
'use strict';
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const common = require('./common.js');
const reopen = require('./reopen.js');

const {AttentionError} = common;

class AttentionClient {
  // target: host:port, dns:///host:port, ipv4:a:p,b:p, ... (a URL or a missing port throws
  // AttentionError). opts: lbPolicy ('round_robin'; 'pick_first', '' for gRPC's default),
  // deadlineMs (30000, every call), maxMessageBytes, tls, tlsCaFile, tlsCertFile, tlsKeyFile,
  // tlsServerName, token / tokenFile (else $ATTENTION_TOKEN), env (for the token).
  constructor(target, opts = {}) {
    common.checkTarget(target);
    this.target = target;
    this.deadlineMs = opts.deadlineMs || 30000;
    this.maxMessageBytes = opts.maxMessageBytes || common.MAX_MESSAGE_BYTES;
    this.security = common.channelSecurity(opts, opts.env || process.env);
    this.tls = this.security.tls;
    this.clientCertificate = !!opts.tlsCertFile;
    this.lbPolicy = opts.lbPolicy === undefined ? 'round_robin' : opts.lbPolicy;
    const v1 = common.loadProtos();
    this._v1 = v1;
    this._stub = new v1.AttentionService(target, this.security.credentials,
                                         this._options(this.lbPolicy));
    this._sessions = new v1.SessionService(target, this.security.credentials,
                                           this._options(this.lbPolicy));
    this._inference = new v1.inference.GRPCInferenceService(target, this.security.credentials,
                                                            this._options(this.lbPolicy));
    this.hasToken = this.security.hasToken;
    this._replicas = new Map();  // address -> SessionService client (pick_first).
  }

  _options(lbPolicy, extra = {}) {
    return {...common.channelOptions(lbPolicy, this.maxMessageBytes), ...this.security.options,
            ...extra};
  }

  _deadline(ms) {
    return new Date(Date.now() + (ms || this.deadlineMs));
  }

  async _error(err) {
    if (err instanceof AttentionError) return err;
    if (err.code === undefined) return err;
    const {hint, summary} = await common.adviseCall(err.code, err.details, this);
    return new AttentionError(err.code, err.details, hint, summary);
  }

  // routingKey: sent as the x-attention-session header (sessions behind a gateway).
  _unary(stub, method, request, routingKey = '') {
    const metadata = this.security.metadata.clone();
    if (routingKey) metadata.set(ROUTING_HEADER, routingKey);
    return new Promise((resolve, reject) => {
      stub[method](request, metadata, {deadline: this._deadline()},
                   (err, response) => {
                     if (err) this._error(err).then(reject);
                     else resolve(response);
                   });
    });
  }

  // The SessionService client for a session id: the replica after '@', else the target.
  sessionStub(sessionId = '') {
    const at = sessionId.indexOf('@');
    if (at < 0) return this._sessions;
    const address = sessionId.slice(at + 1);
    if (!this._replicas.has(address)) {
      this._replicas.set(address, new this._v1.SessionService(
          address, this.security.credentials, this._options('pick_first')));
    }
    return this._replicas.get(address);
  }

  close() {
    this._stub.close();
    this._sessions.close();
    this._inference.close();
    for (const replica of this._replicas.values()) replica.close();
    this._replicas.clear();
  }

  // One Infer. opts: query (required), key, value, keyPaddingMask, attnMask (tensors),
  // isCausal, needWeights, perHeadWeights, model, modelVersion (0: the newest serving),
  // outputDtype, requestId. The result's modelVersion says which version computed it.
  async infer(opts) {
    return common.inferResult(await this._unary(this._stub, 'Infer', common.inferRequest(opts)));
  }

  // Many requests on one InferStream: an async iterator of results as the server answers
  // (possibly out of order: match requestId; a request without one gets its index). A failed
  // request's result has `error` (an AttentionError) and the stream goes on. `requests`: an
  // iterable or async iterable of infer()'s options. When the server closes the stream
  // (UNAVAILABLE: a drain, a connection recycled), a new one is opened and the requests not
  // yet answered are sent again (lib/reopen.js).
  async* inferStream(requests, deadlineMs) {
    const deadline = this._deadline(deadlineMs);
    const key = (message) => reopen.echoed(message.request_id);
    const outbox = new reopen.Outbox(
        requests, (index, opts) => common.inferRequest({requestId: String(index), ...opts}), key);
    const answers = reopen.reopeningStream(
        () => this._stub.InferStream(this.security.metadata.clone(), {deadline}), outbox, key,
        deadline);
    try {
      for await (const response of answers) yield common.inferResult(response);
    } catch (err) {
      throw await this._error(err);
    }
  }

  async models() {
    const response = await this._unary(this._stub, 'ListModels', {});
    return response.models.map(common.modelInfo);
  }

  // version: 0 (the newest serving) or the version to describe.
  async getModel(name = '', version = 0) {
    return common.modelInfo(await this._unary(this._stub, 'GetModel',
                                              {name, version: common.modelVersionOf(version)}));
  }

  // Every model of the server's repository, served or not, one entry per version: {name,
  // version, state ('READY' | 'UNAVAILABLE'), reason} (the Open Inference Protocol's
  // RepositoryIndex, Triton's get_model_repository_index). ready: only READY ones.
  async repositoryIndex(ready = false) {
    const response = await this._unary(this._inference, 'RepositoryIndex',
                                       {repository_name: '', ready: !!ready});
    return response.models.map(common.repositoryModel);
  }

  // Loads (or re-reads) a model from the repository; the versions serving after it. Needs a
  // server run with --model_control=explicit (FAILED_PRECONDITION otherwise) and, with tokens,
  // an admin one (its --admin_tokens_file).
  async loadModel(name) {
    const response = await this._unary(this._stub, 'LoadModel',
                                       {name: modelName(name, 'loadModel')});
    return response.versions.map(Number);
  }

  // Stops serving every version of a model: admitted requests finish, its sessions end.
  // NOT_FOUND when no version of it serves.
  async unloadModel(name) {
    await this._unary(this._stub, 'UnloadModel', {name: modelName(name, 'unloadModel')});
  }

  // grpc.health.v1 Check over a pick_first channel of its own: 'SERVING', 'NOT_SERVING', ...
  // Rejects with AttentionError when the call fails (unreachable: UNAVAILABLE).
  async health(service = '', deadlineMs) {
    const client = new grpc.Client(this.target, this.security.credentials,
                                   this._options('pick_first',
                                                 {'grpc.use_local_subchannel_pool': 1}));
    try {
      return await new Promise((resolve, reject) => {
        client.makeUnaryRequest('/grpc.health.v1.Health/Check', common.healthRequest,
                                common.healthStatus, service, this.security.metadata.clone(),
                                {deadline: this._deadline(deadlineMs)}, (err, status) => {
                                  if (err) this._error(err).then(reject);
                                  else resolve(status);
                                });
      });
    } finally {
      client.close();
    }
  }

  // Waits until the server reports SERVING, up to timeoutMs: true once it does, false if not
  // in time. A fresh connection per poll (every pollMs), so a server is noticed within about
  // pollMs of serving, not after gRPC's reconnect backoff.
  async waitReady(timeoutMs = 30000, service = '', pollMs = 100) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const remaining = deadline - Date.now();
      try {
        const status = await this.health(service, Math.max(50, Math.min(remaining, 1000)));
        if (status === 'SERVING') return true;
      } catch (err) {
        if (!(err instanceof AttentionError)) throw err;
      }
      if (Date.now() + pollMs >= deadline) return false;
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  // Creates a session. opts: model, kind ('self' | 'cross'), ttlS, key, value,
  // keyPaddingMask, isCausal (cross sessions), replay (a ReplayingSession).
  async session(opts = {}) {
    const Class = opts.replay ? ReplayingSession : Session;
    const session = new Class(this, opts);
    await session._create();
    return session;
  }

  async sessionInfo(sessionId) {
    return common.sessionInfo(await this._unary(this.sessionStub(sessionId), 'GetSession',
                                                {session_id: sessionId},
                                                routingKeyOf(sessionId)));
  }

  // Frees a session; the bytes freed. NOT_FOUND if unknown.
  async closeSession(sessionId) {
    const response = await this._unary(this.sessionStub(sessionId), 'CloseSession',
                                       {session_id: sessionId}, routingKeyOf(sessionId));
    return Number(response.freed_bytes);
  }
}

function modelName(name, method) {
  if (typeof name !== 'string' || !name) {
    throw new TypeError(`${method}: expected a model name (a non-empty string), got ` +
                        `${JSON.stringify(name)}`);
  }
  return name;
}

const KINDS = {self: 'SESSION_KIND_SELF', cross: 'SESSION_KIND_CROSS'};

// Sessions behind an L7 gateway (nginx, HAProxy, Istio): every session call carries its routing
// key in this metadata header; a session created with a key has the id "<32 hex>.<key>" (then
// "@<address>" with --advertise_address), so the id alone gives the key.
const ROUTING_HEADER = 'x-attention-session';

// The routing key a session id carries ('' if none): after the first '.' before any '@'.
function routingKeyOf(sessionId) {
  const local = sessionId.split('@', 1)[0];
  const dot = local.indexOf('.');
  return dot < 0 ? '' : local.slice(dot + 1);
}

// A fresh key (128 random bits), drawn for every creation of a session.
function newRoutingKey() {
  return crypto.randomBytes(16).toString('hex');
}

// Whether an error means the session is lost (re-create and replay it): gone (NOT_FOUND), its
// replica unreachable (UNAVAILABLE), or reached on a copy that diverged (expected_length).
function isLost(err) {
  if (!(err instanceof AttentionError)) return false;
  if ([grpc.status.NOT_FOUND, grpc.status.UNAVAILABLE].includes(err.code)) return true;
  return err.code === grpc.status.FAILED_PRECONDITION &&
      String(err.details || '').startsWith('expected_length:');
}

function appendRequest(sessionId, tokens, opts = {}) {
  const request = {
    session_id: sessionId, request_id: opts.requestId || '',
    tokens: common.toProtoTensor(tokens, 'tokens'), need_weights: !!opts.needWeights,
    per_head_weights: !!opts.perHeadWeights,
    output_dtype: common.outputDtypeOf(opts.outputDtype),
  };
  if (opts.notKey) request.not_key = common.toProtoTensor(opts.notKey, 'notKey');
  return request;
}

// One session on the server (AttentionClient.session()): append(), info(), close().
class Session {
  constructor(client, opts) {
    if (opts.kind && !KINDS[opts.kind]) {
      throw new Error(`kind: expected 'self' or 'cross', got '${opts.kind}'`);
    }
    this._client = client;
    this._create_request = {model: opts.model || '', kind: KINDS[opts.kind || 'self'],
                            ttl_s: opts.ttlS || 0, is_causal: !!opts.isCausal};
    for (const [name, field] of [['key', 'key'], ['value', 'value'],
                                 ['keyPaddingMask', 'key_padding_mask']]) {
      if (opts[name]) this._create_request[field] = common.toProtoTensor(opts[name], name);
    }
    this.closed = false;
  }

  // Every creation draws a fresh routing key: the id carries it for later calls.
  async _create() {
    const info = common.sessionInfo(await this._client._unary(
        this._client._sessions, 'CreateSession', this._create_request, newRoutingKey()));
    this.created = info;
    this.sessionId = info.sessionId;
    this.model = info.model;
    this.kind = info.kind;
    this.length = info.length;
    this.maxTokens = info.maxTokens;
    this.closed = false;
  }

  // Sends with the session's current length as expected_length: a copy of the session that
  // diverged from it (reached through a gateway after a replica change) refuses the append.
  async _send(request) {
    const response = await this._client._unary(
        this._client.sessionStub(this.sessionId), 'Append',
        {...request, session_id: this.sessionId, expected_length: this.length},
        routingKeyOf(this.sessionId));
    this.length = Number(response.length);
    return common.appendResult(response);
  }

  // Appends tokens (T, E) and returns their output rows. opts: notKey (T bool), needWeights,
  // perHeadWeights, outputDtype, requestId.
  async append(tokens, opts = {}) {
    return this._send(appendRequest(this.sessionId, tokens, opts));
  }

  async info() {
    return this._client.sessionInfo(this.sessionId);
  }

  // Frees the session; the bytes freed (0 if it was already gone).
  async close() {
    if (this.closed) return 0;
    let freed = 0;
    try {
      freed = await this._client.closeSession(this.sessionId);
    } catch (err) {
      if (!(err instanceof AttentionError) || err.code !== grpc.status.NOT_FOUND) throw err;
    }
    this.closed = true;
    return freed;
  }
}

// A Session that survives losing its server-side state: an append that fails NOT_FOUND or
// UNAVAILABLE re-creates the session (through the target), re-sends every chunk appended so
// far, and retries once; `recoveries` counts this, sessionId changes. As the Python and C++
// clients' ReplayingSession.
class ReplayingSession extends Session {
  constructor(client, opts) {
    super(client, opts);
    this.history = [];
    this.recoveries = 0;
    this._replayed = true;
  }

  async _recreate(stale = false) {
    if (stale) await this._client.closeSession(this.sessionId).catch(() => {});
    this.recoveries += 1;
    this._replayed = false;
    await this._create();
    try {
      for (const chunk of this.history) await this._send(chunk);
    } catch (err) {
      await this._client.closeSession(this.sessionId).catch(() => {});
      throw err;
    }
    this._replayed = true;
  }

  async append(tokens, opts = {}) {
    if (!this._replayed) await this._recreate();
    const request = appendRequest(this.sessionId, tokens, opts);
    let result;
    try {
      result = await this._send(request);
    } catch (err) {
      if (!isLost(err)) throw err;
      await this._recreate(err.code === grpc.status.FAILED_PRECONDITION);
      result = await this._send(request);
    }
    const chunk = {tokens: request.tokens};
    if (request.not_key) chunk.not_key = request.not_key;
    this.history.push(chunk);
    return result;
  }
}

module.exports = {AttentionClient, Session, ReplayingSession, ROUTING_HEADER, routingKeyOf};
