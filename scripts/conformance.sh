#!/usr/bin/env bash
# Run the independent conformance suite `jevcompat` against `typedlm serve` on the embedded model: with auth off
# (open), with an API key (keyed: the auth requirements are only exercised then), and as two replicas on Ray Serve
# with the key (replicas; skipped, and said so, where Ray Serve is not installed). Passes when every MUST and every
# SHOULD passes in at least one run and fails in none (scripts/check_conformance.py).
#
# CONFORMANCE_RUNS names the runs: all three by default (`make conformance`). `make test` runs "open keyed": the
# tests start two replicas with a key anyway (tests/replicas/test_replicas.py), and one of them runs jevcompat
# against those, failing if any requirement fails there; the open and keyed runs pass every one between them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
out=${CONFORMANCE_DIR:-$(mktemp -d)}
port=${CONFORMANCE_PORT:-8737}
runs=${CONFORMANCE_RUNS:-open keyed replicas}
pid=

stop() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; fi; }
trap stop EXIT

run() {  # run NAME [serve options] -- [jevcompat options]
  local name=$1; shift
  local serve=() suite=()
  while [ "$1" != "--" ]; do serve+=("$1"); shift; done; shift
  suite=("$@")
  "$VENV/bin/typedlm" serve --model smollm2-135m --port "$port" "${serve[@]}" >"$out/$name.server.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$out/$name.server.log"; exit 1; }
    sleep 1
  done
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 || { cat "$out/$name.server.log"; exit 1; }
  "$VENV/bin/jevcompat" test "http://127.0.0.1:$port" --timeout 300 --json "$out/$name.json" "${suite[@]}" \
    || echo "jevcompat ($name) exited $? — judged below"
  stop
  reports+=("$out/$name.json")
}

reports=()
for name in $runs; do
  case $name in
    open) run open -- ;;
    keyed) run keyed --api-key conformance-key -- --key conformance-key ;;
    replicas)
      if ! "$VENV/bin/python" -c "import ray.serve" 2>/dev/null; then
        echo "Ray Serve is not installed: the replicas run is skipped (pip install 'typedlm[ray]')"
        continue
      fi
      # Ray Serve's controller gives a starting proxy 5 s to report ready and kills it after three misses, which
      # ends `typedlm serve` on a busy machine; waited for instead, as by tests/replicas/test_replicas.py (whose
      # RAY_PATIENCE says where Ray reads these)
      RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S=60 RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S=60 \
        run replicas --replicas 2 --api-key conformance-key -- --key conformance-key
      ;;
    *) echo "CONFORMANCE_RUNS: unknown run $name (open, keyed, replicas)"; exit 2 ;;
  esac
done
"$VENV/bin/python" scripts/check_conformance.py "${reports[@]}"
