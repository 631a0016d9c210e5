// The examples' command line: [TARGET [LB_POLICY]] and attention-client's security flags
// (--tls, --tls_ca_file, --tls_cert_file, --tls_key_file, --tls_server_name, --token_file;
// the token default: $ATTENTION_TOKEN), and --help. parseCommandLine() returns {target,
// options} for AttentionClient, or prints the usage and exits for --help; it throws on an
// unknown flag or a stray argument, naming it.
'use strict';
const {parseArgs} = require('util');

const FLAGS = {
  help: {type: 'boolean', short: 'h', default: false},
  tls: {type: 'boolean', default: false},
  tls_ca_file: {type: 'string'},
  tls_cert_file: {type: 'string'},
  tls_key_file: {type: 'string'},
  tls_server_name: {type: 'string'},
  token_file: {type: 'string'},
};

const SECURITY_HELP = `
  TARGET             gRPC target: host:port, dns:///host:port, ipv4:a:p,b:p
                     (default: localhost:50051)
  LB_POLICY          round_robin (default) or pick_first
  --tls              TLS with the system's roots (implied by any --tls_* flag)
  --tls_ca_file=F    PEM roots to trust instead of the system's
  --tls_cert_file=F  PEM client certificate (mutual TLS), with --tls_key_file=F
  --tls_server_name=NAME  name expected in the server's certificate
  --token_file=F     bearer token sent on every call (default: $ATTENTION_TOKEN)
  --help             this text`;

function parseCommandLine(usage, args = process.argv.slice(2)) {
  const {values, positionals} = parseArgs({args, options: FLAGS, allowPositionals: true});
  if (values.help) {
    console.log(`${usage}\n${SECURITY_HELP}`);
    process.exit(0);
  }
  if (positionals.length > 2) {
    throw new Error(`unexpected argument '${positionals[2]}' (usage: --help)`);
  }
  return {
    target: positionals[0] || 'localhost:50051',
    options: {
      lbPolicy: positionals[1] ?? 'round_robin', tls: values.tls, tlsCaFile: values.tls_ca_file,
      tlsCertFile: values.tls_cert_file, tlsKeyFile: values.tls_key_file,
      tlsServerName: values.tls_server_name, tokenFile: values.token_file, deadlineMs: 10000,
    },
  };
}

module.exports = {parseCommandLine};
