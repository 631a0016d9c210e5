// attention-client's errors and hints: AttentionError, the target checks, and advise(), which
// tells what to do about a failed call when the client can (nothing listening at the target, a
// TLS/plaintext mismatch, a message over a size limit, a missing or refused token, a deadline
// passed), as attention-client's client/cli/call_advice.cc does. Stateless.
'use strict';
const net = require('net');
const grpc = require('@grpc/grpc-js');

const STATUS_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));


// summary: what the message says instead of the raw details (e.g. "cannot connect to
// host:port: connection refused" for grpc-js's "No connection established. Last error: ...").
class AttentionError extends Error {
  constructor(code, details, hint, summary) {
    const codeName = STATUS_NAMES[code] || `CODE_${code}`;
    super(`${codeName}: ${summary || details}${hint ? ` (${hint})` : ''}`);
    this.name = 'AttentionError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.hint = hint || null;
  }
}

const OTHER_SCHEMES = ['unix:', 'unix-abstract:', 'vsock:', 'xds:', 'google-c2p:'];
const HOST_PORT = /^(\[[^\]]*\]|[^:[\]/]*)(?::([^:/]*))?$/;

function invalidTarget(target, what) {
  return new AttentionError(grpc.status.INVALID_ARGUMENT, `target '${target}': ${what}`);
}

function checkHostPort(target, hostPort, default443 = true) {
  const m = HOST_PORT.exec(hostPort);
  if (!m || !m[1]) {
    if ((hostPort.match(/:/g) || []).length > 1 && !hostPort.startsWith('[')) {
      throw invalidTarget(target, `an IPv6 address goes in brackets: '[${hostPort}]:50051'`);
    }
    throw invalidTarget(target, "expected host:port, e.g. 'localhost:50051'");
  }
  if (m[2] === undefined || m[2] === '') {
    throw invalidTarget(target, `no port${default443 ? ' (gRPC would use 443)' : ''}: give ` +
                                `host:port, e.g. '${m[1]}:50051'`);
  }
  if (!/^\d+$/.test(m[2]) || Number(m[2]) < 1 || Number(m[2]) > 65535) {
    throw invalidTarget(target, `port '${m[2]}': expected a number from 1 to 65535`);
  }
}

// Throws AttentionError (INVALID_ARGUMENT) for a target gRPC would misread: a URL, or
// host:port without the port (gRPC's DNS resolver would use 443).
function checkTarget(target) {
  if (typeof target !== 'string' || !target) {
    throw invalidTarget(target, "expected host:port, e.g. 'localhost:50051'");
  }
  const url = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/(.*)$/.exec(target);
  if (url && url[1].toLowerCase() !== 'dns') {
    const scheme = url[1].toLowerCase();
    if (OTHER_SCHEMES.includes(`${scheme}:`)) return;
    const rest = url[2].split('/')[0];
    const example = /:\d+$/.test(rest) ? rest : `${rest}:50051`;
    const tls = scheme === 'https' || scheme === 'grpcs' ? ' and tls: true' : '';
    throw invalidTarget(target, `a URL; a gRPC target is host:port: use '${example}'${tls}`);
  }
  if (OTHER_SCHEMES.some((s) => target.startsWith(s))) return;
  if (target.startsWith('dns:')) {
    let rest = target.slice(4);
    if (rest.startsWith('//')) rest = rest.slice(2).includes('/') ? rest.slice(2).split('/').slice(1).join('/') : '';
    checkHostPort(target, rest);
    return;
  }
  for (const scheme of ['ipv4:', 'ipv6:']) {
    if (target.startsWith(scheme)) {
      for (const address of target.slice(5).split(',')) checkHostPort(target, address, false);
      return;
    }
  }
  checkHostPort(target, target);
}

function firstAddress(target) {
  let rest = target;
  if (rest.startsWith('dns:')) {
    rest = rest.slice(4);
    if (rest.startsWith('//')) rest = rest.slice(2).split('/').slice(1).join('/');
  } else if (rest.startsWith('ipv4:') || rest.startsWith('ipv6:')) {
    rest = rest.slice(5).split(',')[0];
  }
  const m = HOST_PORT.exec(rest);
  if (!m || !/^\d+$/.test(m[2] || '')) return null;
  return {host: m[1].replace(/^\[|\]$/g, ''), port: Number(m[2])};
}

const PREFACE = Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
                               Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]);

// What listens at host:port, from one plaintext HTTP/2 preface: 'http2' (a SETTINGS frame
// came back: a plaintext gRPC server), 'tls' (a TLS record, or a hang-up without a byte),
// 'none' (the connection was refused: nothing listens there), or null (no answer).
function probeHttp2(host, port, timeoutMs = 1000) {
  return new Promise((resolve) => {
    let data = Buffer.alloc(0);
    let connected = false;
    const socket = net.connect({host, port});
    const done = (answer) => {
      socket.destroy();
      resolve(answer);
    };
    socket.setTimeout(timeoutMs, () => done(null));
    socket.on('connect', () => {
      connected = true;
      socket.write(PREFACE);
    });
    socket.on('data', (chunk) => {
      data = Buffer.concat([data, chunk]);
      if (data.length >= 4 && data[3] === 0x04) done('http2');
      else if (data[0] === 0x15 || data[0] === 0x16) done('tls');
      else if (data.length >= 9) done(null);
    });
    socket.on('error', (err) => {
      if (!connected && err.code === 'ECONNREFUSED') done('none');
      else done(connected && err.code === 'ECONNRESET' ? 'tls' : null);
    });
    socket.on('end', () => done(connected && data.length === 0 ? 'tls' : null));
  });
}

const CONNECT_FAILURE = /failed to connect|Socket closed|reset by peer|[Hh]andshake|backends failing|Broken pipe|End of TCP stream|SSL|TLS|No connection established|ECONNRESET/;
const TOO_LARGE = /(Sent|Received) message larger than max \((\d+) vs\.? (\d+)\)/;

// A hint for a failed call (null when there is none). `client`: {target, tls,
// clientCertificate, maxMessageBytes, hasToken, deadlineMs}.
async function advise(code, details, client) {
  return (await adviseCall(code, details, client)).hint;
}

// {hint, summary}: the hint (null when there is none) and, when nothing listens at the
// target, a summary to show instead of grpc-js's text.
async function adviseCall(code, details, client) {
  const hint = await adviseHint(code, details || '', client);
  return typeof hint === 'object' && hint !== null ? hint : {hint, summary: null};
}

async function adviseHint(code, details, client) {
  const sendLimit = /Attempted to send message with a size larger than (\d+)/.exec(details);
  if (sendLimit) {  // grpc-js's own words for its send limit.
    return `the request is over this client's limit of ${sendLimit[1]} bytes: raise ` +
           "maxMessageBytes (the server's limit is its --max_message_bytes)";
  }
  const tooLarge = TOO_LARGE.exec(details);
  if (tooLarge) {
    const [, direction, size, limit] = tooLarge;
    if (Number(limit) === client.maxMessageBytes) {
      const what = direction === 'Sent' ? 'the request' : 'the response';
      return `${what} is ${size} bytes, over this client's limit of ${limit}: raise ` +
             "maxMessageBytes (the server's limit is its --max_message_bytes)";
    }
    const what = direction === 'Received' ? 'the request' : 'the response';
    return `${what} is ${size} bytes, over the server's limit of ${limit}: send less per ` +
           `request, or start the server with --max_message_bytes=${size} or more`;
  }
  if (code === grpc.status.UNAUTHENTICATED) {
    return client.hasToken ?
        "the server refused this client's bearer token (the token or tokenFile option, else " +
            "$ATTENTION_TOKEN): use one the server's --auth_tokens_file lists" :
        "the server wants a bearer token: pass the option token: '<token>' or tokenFile: " +
            "'<file>' to new AttentionClient(), or set ATTENTION_TOKEN";
  }
  if (code === grpc.status.DEADLINE_EXCEEDED && client.deadlineMs) {
    return `the call took longer than deadlineMs=${client.deadlineMs}: raise it (the ` +
           'deadlineMs option of new AttentionClient()) if the server is busy or the request large';
  }
  if (![grpc.status.UNAVAILABLE, grpc.status.UNKNOWN, grpc.status.INTERNAL].includes(code) ||
      !CONNECT_FAILURE.test(details)) {
    return null;
  }
  if (client.tls && /certificate[ _]verify[ _]failed|self.signed|unable to (get|verify)/i.test(details)) {
    return "the client does not trust the server's certificate: pass tlsCaFile (the CA that " +
           'signed it), or tlsServerName (a name it carries)';
  }
  const address = firstAddress(client.target);
  const answer = address ? await probeHttp2(address.host, address.port) : null;
  if (answer === 'none') {
    const at = `${address.host.includes(':') ? `[${address.host}]` : address.host}:${address.port}`;
    return {summary: `cannot connect to ${at}: connection refused`,
            hint: `nothing is listening at ${at}? start attention-server there, or pass the ` +
                  "host:port of a running one as the target: new AttentionClient('host:port')"};
  }
  if (!client.tls && answer === 'tls') {
    return 'the server speaks TLS: pass tls: true (and tlsCaFile: its CA unless the system ' +
           'trusts it)';
  }
  if (client.tls && answer === 'http2') {
    return 'the server speaks plaintext, not TLS: leave out tls and the tls* options';
  }
  if (client.tls && /certificate[ _]required/i.test(details)) {
    return 'the server requires a client certificate (mutual TLS): pass tlsCertFile and ' +
           'tlsKeyFile';
  }
  if (client.tls && /unknown[ _]ca|bad[ _]certificate|certificate[ _]unknown|decrypt[ _]error/i.test(details)) {
    return 'the server did not accept the client certificate: use one signed by a CA the ' +
           'server trusts (its --tls_client_ca_file)';
  }
  if (client.tls && answer === 'tls') {
    return client.clientCertificate ?
        'the TLS handshake failed: the server did not accept the client certificate; use one ' +
            'signed by a CA the server trusts (its --tls_client_ca_file)' :
        'the TLS handshake failed: if the server requires a client certificate (mutual TLS), ' +
            'pass tlsCertFile and tlsKeyFile';
  }
  return null;
}

module.exports = {
  STATUS_NAMES, AttentionError, checkTarget, firstAddress, probeHttp2, advise, adviseCall,
};
