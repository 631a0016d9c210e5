#!/usr/bin/env bash
# node_package_test: the Node.js client as a user installs it. `npm pack` in a copy of
# client/node (beside a copy of proto/, which its prepack step bundles into the package), then
# `npm install <tarball>` into an empty folder, then, from that folder: `tsc --noEmit` on
# test/usage.ts against the installed declarations (and test/misuse.ts must fail), and
# test/test.js against the installed package (ATTENTION_NODE_INSTALLED=1), examples included.
# typescript comes from client/node's devDependencies (scripts/install_deps.sh test: npm ci).
#
# Usage: installed_test.sh REPO SERVER_BINARY VERSION
set -euo pipefail
repo=$1 server=$2 version=$3
node_dir=$repo/client/node
tsc=$node_dir/node_modules/.bin/tsc
if [[ ! -x $tsc ]]; then
  message="client/node/node_modules is missing (scripts/install_deps.sh test runs npm ci)"
  [[ -n ${CI:-} ]] && { echo "FAIL: $message" >&2; exit 1; }
  echo "SKIPPED: $message"
  exit 77
fi

work=$(mktemp -d /tmp/attention-node-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/client/node" "$work/app"
tar -C "$node_dir" --exclude=./node_modules --exclude=./proto -c . | tar -C "$work/src/client/node" -x
cp -r "$repo/proto" "$work/src/proto"
echo "[node_package_test] npm pack"
(cd "$work/src/client/node" && npm pack --pack-destination "$work" --loglevel=error >/dev/null)
tarball=$(ls "$work"/attention-client-*.tgz)
# The listing is read whole first: `tar | grep -q` under pipefail fails whenever grep exits at
# its match before tar has written everything (tar dies of SIGPIPE).
listing=$(tar -tzf "$tarball")
sed 's/^/  /' <<<"$listing"
for proto in attention/v1/sessions.proto inference/grpc_predict_v2.proto \
             inference/model_config.proto; do
  grep -qx "package/proto/$proto" <<<"$listing" \
    || { echo "FAIL: the tarball lacks proto/$proto" >&2; exit 1; }
done

cd "$work/app"
echo '{"name": "attention-client-user", "private": true}' > package.json
echo "[node_package_test] npm install $(basename "$tarball") into an empty folder"
npm install --no-audit --no-fund --prefer-offline --loglevel=error "$tarball"
cp "$node_dir/test/test.js" "$node_dir/test/usage.ts" "$node_dir/test/misuse.ts" \
   "$node_dir/test/tsconfig.json" .

echo "[node_package_test] tsc --noEmit usage.ts (typescript $("$tsc" --version))"
"$tsc" -p tsconfig.json
if "$tsc" --noEmit --strict --types node misuse.ts >misuse.log 2>&1; then
  echo "FAIL: tsc accepted misuse.ts: the declarations check nothing" >&2
  exit 1
fi
grep -c "error TS" misuse.log | sed 's/^/  misuse.ts: tsc errors as expected: /'

echo "[node_package_test] test.js against the installed package"
ATTENTION_NODE_INSTALLED=1 ATTENTION_VERSION="$version" ATTENTION_SERVER_BINARY="$server" \
  node test.js
