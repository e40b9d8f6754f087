#!/usr/bin/env bash
# Run the independent conformance suite `jevcompat` against `typedlm serve` on the embedded model, three times:
# with auth off, with an API key (the auth requirements are only exercised then), and as two replicas on Ray Serve
# with the key (skipped, and said so, where Ray Serve is not installed). Passes when every MUST and every SHOULD
# passes in at least one run and fails in none. The first two runs go side by side, each with its server on a port of
# its own: a run's server and client use about one core between them, and beside pytest (`make test`) a suite that
# ran them one after the other kept going alone, on one core, for about 30 s after the tests had ended.
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

side_by_side() {  # side_by_side PORT NAME [serve options] -- [jevcompat options]: `run` in a subshell, its output
  # kept in NAME.out
  (
    port=$1; shift
    trap stop EXIT
    trap 'exit 1' TERM
    run "$@" >"$out/$1.out" 2>&1
  )
}

trap 'stop; kill $(jobs -p) 2>/dev/null || true' EXIT
side_by_side "$port" open -- & open=$!
side_by_side "$((port + 1))" keyed --api-key conformance-key -- --key conformance-key & keyed=$!
wait "$open" && opened=0 || opened=$?
wait "$keyed" && keyed=0 || keyed=$?
cat "$out/open.out" "$out/keyed.out"
[ "$opened" = 0 ] && [ "$keyed" = 0 ]
reports=("$out/open.json" "$out/keyed.json")
if "$VENV/bin/python" -c "import ray.serve" 2>/dev/null; then
  run replicas --replicas 2 --api-key conformance-key -- --key conformance-key
  reports+=("$out/replicas.json")
else
  echo "Ray Serve is not installed: the replicas run is skipped (pip install 'typedlm[ray]')"
fi
"$VENV/bin/python" scripts/check_conformance.py "${reports[@]}"
