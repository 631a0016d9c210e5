// attention-client: the Node.js client of attention-service (attention.v1 over gRPC, with
// @grpc/grpc-js; the protos are bundled in the package). index.d.ts has the types.
//
//   const {AttentionClient, float32} = require('attention-client');
//   const client = new AttentionClient('localhost:50051');   // {tls, tlsCaFile, tokenFile, ...}
//   await client.waitReady(10000);                            // true once SERVING
//   const r = await client.infer({query: float32(values, [1, 8, 256]), isCausal: true});
//   for await (const s of client.inferStream(requests)) s.requestId, s.error || s.output;
//   const session = await client.session({replay: true});
//   await session.append(float32(token, [1, 256]));
//   await session.close();
//   client.close();
'use strict';
module.exports = {...require('./lib/common.js'), ...require('./lib/client.js')};
