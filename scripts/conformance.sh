#!/usr/bin/env bash
# Run the independent conformance suite `jevcompat` against `typedlm serve` on the embedded model, three times:
# with auth off, with an API key (the auth requirements are only exercised then), and as two replicas on Ray Serve
# with the key (skipped, and said so, where Ray Serve is not installed). Passes when every MUST and every SHOULD
# passes in at least one run and fails in none.
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
  # a server that exits before it answers is started once more: on a loaded machine (this suite runs beside the
  # tests) Ray Serve's proxy can miss its own 60 s start deadline; a second failure fails the suite
  for attempt in 1 2; do
    "$VENV/bin/typedlm" serve --port "$port" "${serve[@]}" >"$out/$name.server.log" 2>&1 &
    pid=$!
    for _ in $(seq 180); do
      curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break 2
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    cat "$out/$name.server.log"
    stop
    [ "$attempt" = 2 ] && exit 1
    echo "typedlm serve ($name) did not start: once more"
  done
  "$VENV/bin/jevcompat" test "http://127.0.0.1:$port" --timeout 300 --json "$out/$name.json" "${suite[@]}" \
    || echo "jevcompat ($name) exited $? — judged below"
  stop
}

run open --
run keyed --api-key conformance-key -- --key conformance-key
reports=("$out/open.json" "$out/keyed.json")
if "$VENV/bin/python" -c "import ray.serve" 2>/dev/null; then
  run replicas --replicas 2 --api-key conformance-key -- --key conformance-key
  reports+=("$out/replicas.json")
else
  echo "Ray Serve is not installed: the replicas run is skipped (pip install 'typedlm[ray]')"
fi
"$VENV/bin/python" scripts/check_conformance.py "${reports[@]}"
