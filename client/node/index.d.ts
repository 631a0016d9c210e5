// Type declarations of attention-client (index.js): attention.v1 over gRPC from Node.js.

/** The element types of a tensor. */
export type DType = 'float32' | 'float16' | 'bfloat16' | 'bool';

/** A dense row-major tensor. float16 and bfloat16 data are raw 16-bit words. */
export interface Tensor {
  dtype: DType;
  shape: number[];
  data: Float32Array | Uint16Array | Uint8Array;
}

/** A failed call: the gRPC status (number and name), its message, and what to do about it
 * when the client can tell (nothing listening at the target, a TLS/plaintext mismatch, a
 * message over a size limit, a missing or refused token, a deadline passed). The message shows
 * `summary` instead of the raw details when there is one ("cannot connect to host:port:
 * connection refused"); `details` keeps gRPC's text. */
export class AttentionError extends Error {
  constructor(code: number, details: string, hint?: string | null, summary?: string | null);
  readonly code: number;
  /** 'UNAVAILABLE', 'INVALID_ARGUMENT', ... */
  readonly codeName: string;
  readonly details: string;
  readonly hint: string | null;
}

export interface ClientOptions {
  /** 'round_robin' (default), 'pick_first', or '' for gRPC's default. */
  lbPolicy?: string;
  /** Deadline of every call (default 30000). */
  deadlineMs?: number;
  /** The largest message sent or received (default 256 MiB). */
  maxMessageBytes?: number;
  /** TLS with the system's roots (implied by any tls* option). */
  tls?: boolean;
  tlsCaFile?: string;
  tlsCertFile?: string;
  tlsKeyFile?: string;
  tlsServerName?: string;
  /** Bearer token ('' for none); default: tokenFile's contents, else $ATTENTION_TOKEN. */
  token?: string;
  tokenFile?: string;
  /** Where $ATTENTION_TOKEN is read (default: process.env). */
  env?: Record<string, string | undefined>;
}

export interface InferOptions {
  query: Tensor;
  key?: Tensor;
  value?: Tensor;
  keyPaddingMask?: Tensor;
  attnMask?: Tensor;
  isCausal?: boolean;
  needWeights?: boolean;
  perHeadWeights?: boolean;
  /** '' or absent: the server's default model. */
  model?: string;
  /** The model version to run (a whole number); 0 or absent: the newest serving version. */
  modelVersion?: number;
  outputDtype?: 'float32' | 'float16' | 'bfloat16';
  requestId?: string;
}

export interface InferResult {
  requestId: string;
  /** null only for a failed request of inferStream(). */
  output: Tensor | null;
  attnWeights: Tensor | null;
  queueUs: number;
  computeUs: number;
  batchRequests: number;
  /** The model version that computed it. */
  modelVersion: number;
  /** inferStream(): this request failed (the stream went on). */
  error: AttentionError | null;
}

export interface BatchingConfig {
  maxBatchSize: number;
  maxBatchTokens: number;
  maxQueueDelayUs: number;
  maxQueueSize: number;
}

/** One version of a model and its state. */
export interface ModelVersionState {
  version: number;
  state: 'READY' | 'UNAVAILABLE' | string;
  /** Why not READY (a refused load names the file and what was wrong); '' when READY. */
  reason: string;
}

/** One entry of the repository index (Triton's get_model_repository_index). */
export interface RepositoryModel {
  name: string;
  /** 0 when the server names no version (a folder with none loadable). */
  version: number;
  state: 'READY' | 'UNAVAILABLE' | string;
  reason: string;
}

export interface ModelInfo {
  name: string;
  embedDim: number;
  numHeads: number;
  kdim: number;
  vdim: number;
  bias: boolean;
  addBiasKv: boolean;
  addZeroAttn: boolean;
  computeDtype: string;
  isDefault: boolean;
  /** The version described: the newest serving, or the one asked of getModel(). */
  version: number;
  /** Every known version of the model and its state. */
  versions: ModelVersionState[];
  /** The layout of query, key, value and output: true (N, L, E), false (L, N, E). */
  batchFirst: boolean;
  batching: BatchingConfig;
}

export type HealthStatus = 'UNKNOWN' | 'SERVING' | 'NOT_SERVING' | 'SERVICE_UNKNOWN';

export interface SessionOptions {
  model?: string;
  kind?: 'self' | 'cross';
  ttlS?: number;
  /** Cross sessions: (S, kdim), (S, vdim), (S). */
  key?: Tensor;
  value?: Tensor;
  keyPaddingMask?: Tensor;
  isCausal?: boolean;
  /** A ReplayingSession: re-created and replayed when lost. */
  replay?: boolean;
}

export interface AppendOptions {
  /** (T) bool: stored, but attended by no token. */
  notKey?: Tensor;
  needWeights?: boolean;
  perHeadWeights?: boolean;
  outputDtype?: 'float32' | 'float16' | 'bfloat16';
  requestId?: string;
}

export interface AppendResult {
  sessionId: string;
  requestId: string;
  output: Tensor | null;
  attnWeights: Tensor | null;
  length: number;
  queueUs: number;
  computeUs: number;
  batchRequests: number;
  /** The session's model version, which computes all its appends. */
  modelVersion: number;
  error: AttentionError | null;
}

export interface SessionInfo {
  sessionId: string;
  model: string;
  kind: 'self' | 'cross' | 'unspecified';
  length: number;
  keys: number;
  bytes: number;
  createdUnixMs: number;
  lastUsedUnixMs: number;
  ttlS: number;
  maxTokens: number;
  /** The model version the session was created on. */
  modelVersion: number;
}

export class Session {
  readonly sessionId: string;
  readonly model: string;
  readonly kind: string;
  /** Tokens appended so far (after the last append). */
  length: number;
  readonly maxTokens: number;
  readonly created: SessionInfo;
  closed: boolean;
  append(tokens: Tensor, opts?: AppendOptions): Promise<AppendResult>;
  info(): Promise<SessionInfo>;
  /** Frees the session; the bytes freed (0 if it was already gone). */
  close(): Promise<number>;
}

export class ReplayingSession extends Session {
  /** Re-creations so far. */
  recoveries: number;
}

export class AttentionClient {
  constructor(target: string, opts?: ClientOptions);
  readonly target: string;
  readonly tls: boolean;
  readonly deadlineMs: number;
  readonly maxMessageBytes: number;
  infer(opts: InferOptions): Promise<InferResult>;
  inferStream(requests: Iterable<InferOptions> | AsyncIterable<InferOptions>,
              deadlineMs?: number): AsyncGenerator<InferResult, void, undefined>;
  models(): Promise<ModelInfo[]>;
  /** version: 0 or absent: the newest serving. */
  getModel(name?: string, version?: number): Promise<ModelInfo>;
  /** Every model version of the server's repository and its state; ready: only READY ones. */
  repositoryIndex(ready?: boolean): Promise<RepositoryModel[]>;
  /** Loads (or re-reads) a model (a server with --model_control=explicit); the versions
   * serving after it. */
  loadModel(name: string): Promise<number[]>;
  /** Stops serving every version of a model. */
  unloadModel(name: string): Promise<void>;
  health(service?: string, deadlineMs?: number): Promise<HealthStatus>;
  waitReady(timeoutMs?: number, service?: string, pollMs?: number): Promise<boolean>;
  session(opts: SessionOptions & {replay: true}): Promise<ReplayingSession>;
  session(opts?: SessionOptions): Promise<Session>;
  sessionInfo(sessionId: string): Promise<SessionInfo>;
  closeSession(sessionId: string): Promise<number>;
  close(): void;
}

export const VERSION: string;
/** The metadata header carrying a session's routing key ('x-attention-session'). */
export const ROUTING_HEADER: string;
/** The routing key a session id carries ('' if none). */
export function routingKeyOf(sessionId: string): string;
export const MAX_MESSAGE_BYTES: number;
/** A float32 tensor of `data` with `shape`. */
export function float32(data: ArrayLike<number>, shape: number[]): Tensor;
/** A bool tensor (masks) of `data` with `shape`. */
export function bool(data: ArrayLike<boolean | number>, shape: number[]): Tensor;
/** The float32 values of a float32, float16 or bfloat16 tensor. */
export function toFloat32(tensor: Tensor): Float32Array;
/** Throws AttentionError (INVALID_ARGUMENT) for a URL or a target without a port. */
export function checkTarget(target: string): void;
/** The channel's service config for a load-balancing policy. */
export function serviceConfig(lbPolicy?: string): object;
/** The channel's options (service config, message limits, retry buffers). */
export function channelOptions(lbPolicy?: string, maxMessageBytes?: number): Record<string, string | number>;
