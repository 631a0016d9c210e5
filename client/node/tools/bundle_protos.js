#!/usr/bin/env node
// `npm pack` / `npm publish` steps: prepack copies the repository's attention.v1 protos and the
// Open Inference Protocol's (RepositoryIndex) into the package (proto/), so the package works outside the repository; postpack removes the
// copy again (in the repository, lib/common.js reads ../../proto directly).
//   node tools/bundle_protos.js          # copy
//   node tools/bundle_protos.js --clean  # remove
'use strict';
const fs = require('fs');
const path = require('path');

const here = path.join(__dirname, '..');
const target = path.join(here, 'proto');
if (process.argv.includes('--clean')) {
  fs.rmSync(target, {recursive: true, force: true});
} else {
  const protos = ['attention/v1/attention.proto', 'attention/v1/sessions.proto',
                  'inference/grpc_predict_v2.proto', 'inference/model_config.proto'];
  for (const name of protos) {
    fs.mkdirSync(path.dirname(path.join(target, name)), {recursive: true});
    fs.copyFileSync(path.join(here, '..', '..', 'proto', name), path.join(target, name));
  }
}
