#!/usr/bin/env bash
# Run the independent conformance suite `jevcompat` against `typedlm serve` on the embedded model, twice:
# with auth off, and with an API key (the auth requirements are only exercised then). Passes when every
# MUST and every SHOULD passes in at least one run and fails in none.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
out=${CONFORMANCE_DIR:-$(mktemp -d)}
port=${CONFORMANCE_PORT:-8737}
pid=

stop() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; fi; }
trap stop EXIT

run() {  # run NAME [serve options] -- [jevcompat options]
  local name=$1; shift
  local serve=() suite=()
  while [ "$1" != "--" ]; do serve+=("$1"); shift; done; shift
  suite=("$@")
  "$VENV/bin/typedlm" serve --port "$port" "${serve[@]}" >"$out/$name.server.log" 2>&1 &
  pid=$!
  for _ in $(seq 180); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$out/$name.server.log"; exit 1; }
    sleep 1
  done
  "$VENV/bin/jevcompat" test "http://127.0.0.1:$port" --timeout 300 --json "$out/$name.json" "${suite[@]}" \
    || echo "jevcompat ($name) exited $? — judged below"
  stop
}

run open --
run keyed --api-key conformance-key -- --key conformance-key
"$VENV/bin/python" scripts/check_conformance.py "$out/open.json" "$out/keyed.json"
