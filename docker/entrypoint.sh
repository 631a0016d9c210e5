#!/bin/sh
# Serves the models mounted at /models (any folder with a config.json, or with
# numbered version folders holding one), or the built-in demo model when none
# is mounted. Extra arguments go to the server.
# exec: the server becomes PID 1 and handles SIGTERM (drain, exit 0) itself.
set -e
for config in /models/*/config.json /models/*/[1-9]*/config.json; do
  if [ -f "$config" ]; then
    exec /usr/local/bin/attention-server --model_repository=/models "$@"
  fi
done
exec /usr/local/bin/attention-server "$@"
