#!/usr/bin/env node
// `npm pack` / `npm publish` steps: prepack copies the repository's proto/attention/v1/*.proto
// into the package (proto/), so the package works outside the repository; postpack removes the
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
  const source = path.join(here, '..', '..', 'proto', 'attention', 'v1');
  fs.mkdirSync(path.join(target, 'attention', 'v1'), {recursive: true});
  for (const name of ['attention.proto', 'sessions.proto']) {
    fs.copyFileSync(path.join(source, name), path.join(target, 'attention', 'v1', name));
  }
}
