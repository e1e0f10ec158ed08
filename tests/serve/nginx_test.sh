#!/usr/bin/env bash
# Two `posttrainllm serve` replicas behind Debian's nginx, configured from
# deploy/nginx.conf (ports rewritten, run in the foreground from a temp dir):
# 32 concurrent streamed requests through nginx, none lost, both replicas used.
# Usage: nginx_test.sh CLI MODEL REPO_DIR
set -euo pipefail
CLI=$1 MODEL=$2 REPO=$3
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
TMP=$(mktemp -d)
chmod 755 "$TMP"  # nginx workers run as nobody when started by root
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -5 "$TMP"/*.log 2>/dev/null; exit 1; }
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

for i in 1 2; do
  OMP_WAIT_POLICY=passive "$CLI" serve "$MODEL" --port 0 --threads 1 2> "$TMP/replica$i.log" &
  PIDS+=($!)
done
for i in 1 2; do
  for _ in $(seq 300); do grep -qs 'listening on' "$TMP/replica$i.log" && break; sleep 0.1; done
  grep -q 'listening on' "$TMP/replica$i.log" || fail "replica $i did not start"
done
P1=$(grep -o '127.0.0.1:[0-9]*' "$TMP/replica1.log" | cut -d: -f2)
P2=$(grep -o '127.0.0.1:[0-9]*' "$TMP/replica2.log" | cut -d: -f2)
PN=$(free_port)
mkdir -p "$TMP/nginx"
sed -e "s/127.0.0.1:8081/127.0.0.1:$P1/" -e "s/127.0.0.1:8082/127.0.0.1:$P2/" \
    -e "s/listen 127.0.0.1:8080;/listen 127.0.0.1:$PN;/" -e "s/worker_processes auto;/worker_processes 1;/" \
    -e "s|^http {|http {\n  access_log $TMP/access.log;\n  client_body_temp_path $TMP/nginx/body;\n  proxy_temp_path $TMP/nginx/proxy;\n  fastcgi_temp_path $TMP/nginx/fastcgi;\n  uwsgi_temp_path $TMP/nginx/uwsgi;\n  scgi_temp_path $TMP/nginx/scgi;|" \
    "$REPO/deploy/nginx.conf" > "$TMP/nginx.conf"
printf 'pid %s/nginx.pid;\nerror_log %s/nginx-error.log;\n' "$TMP" "$TMP" | cat - "$TMP/nginx.conf" > "$TMP/nginx2.conf"
"$NGINX" -t -p "$TMP/nginx" -c "$TMP/nginx2.conf" -g 'daemon off;' 2> "$TMP/nginx-t.log" || fail "nginx -t: $(cat "$TMP/nginx-t.log")"
"$NGINX" -p "$TMP/nginx" -c "$TMP/nginx2.conf" -g 'daemon off;' 2> "$TMP/nginx.log" &
PIDS+=($!)
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$PN/health" && break; sleep 0.1; done

N=32 TOKENS=64
for i in $(seq $N); do
  curl -sN "http://127.0.0.1:$PN/v1/completions" \
    -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":$TOKENS,\"ignore_eos\":true,\"stream\":true,\"seed\":$i}" \
    > "$TMP/out$i" &
  CURLS+=($!)
done
for p in "${CURLS[@]}"; do wait "$p" || fail "a curl failed"; done
for i in $(seq $N); do
  [ "$(grep '^data: ' "$TMP/out$i" | tail -1)" = 'data: [DONE]' ] || fail "stream $i did not end with [DONE]: $(tail -c 300 "$TMP/out$i")"
  grep -q "\"finish_reason\":\"length\".*\"completion_tokens\":$TOKENS" "$TMP/out$i" || fail "stream $i incomplete"
done
# least_conn spread the streams over both replicas.
for p in $P1 $P2; do
  G=$(curl -s "http://127.0.0.1:$p/metrics" | grep '^ptllm_generation_tokens_total ' | cut -d' ' -f2)
  [ "$G" -gt 0 ] || fail "replica on port $p served nothing"
  echo "replica :$p generated $G tokens"
done
echo "serve nginx: $N streams through nginx, none lost"
