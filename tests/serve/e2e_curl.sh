#!/usr/bin/env bash
# `posttrainllm serve` driven with curl: completions streamed and not, SSE
# framing, errors with their status, /metrics names. Usage: e2e_curl.sh CLI MODEL
set -euo pipefail
CLI=$1 MODEL=$2
TMP=$(mktemp -d)
OMP_WAIT_POLICY=passive "$CLI" serve "$MODEL" --port 0 --threads 1 2> "$TMP/log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 300); do grep -qs 'listening on' "$TMP/log" && break; sleep 0.1; done
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$TMP/log")
fail() { echo "FAIL: $*"; cat "$TMP/log"; exit 1; }
# status BODY_FILE METHOD PATH [DATA]
req() { curl -s -o "$TMP/body" -w '%{http_code}' -X "$1" "$URL$2" -H 'Content-Type: application/json' ${3:+--data-binary "$3"}; }

[ "$(req GET /health)" = 200 ] || fail health
# Bad flags are one-line errors naming the flag.
! "$CLI" serve "$MODEL" --kv-budget 12XB 2> "$TMP/err" || fail "--kv-budget 12XB accepted"
grep -q '^error: --kv-budget 12XB: expected a positive size' "$TMP/err" || fail "bad budget message: $(cat "$TMP/err")"
! "$CLI" serve "$MODEL" --kv-budget 1KiB 2> "$TMP/err" || fail "a budget below one request accepted"
grep -q '^error: --kv-budget 1KiB: one request with the default cache' "$TMP/err" || fail "small budget: $(cat "$TMP/err")"
! "$CLI" serve "$MODEL" --streaming-llm-sink 4 2> "$TMP/err" || fail "sink without window accepted"
grep -q '^error: .*--streaming-llm-window' "$TMP/err" || fail "sink without window: $(cat "$TMP/err")"
[ "$(req POST /v1/completions '{"prompt":"Once upon a time","max_tokens":12,"temperature":0}')" = 200 ] || fail completion
grep -q '"object":"text_completion"' "$TMP/body" || fail "completion object: $(cat "$TMP/body")"
grep -q '"completion_tokens":12' "$TMP/body" || fail "usage: $(cat "$TMP/body")"
grep -q '"text":", there was a little girl named Lily' "$TMP/body" || fail "greedy text: $(cat "$TMP/body")"

# Streamed: data: events, the last before [DONE] with finish_reason and usage.
curl -sN "$URL/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":12,"temperature":0,"stream":true}' > "$TMP/sse"
# Tokens produced while the previous event was being written go out together, so count >= 3.
[ "$(grep -c '^data: ' "$TMP/sse")" -ge 3 ] || fail "token events + final + [DONE]: $(cat "$TMP/sse")"
STREAMED=$(grep '^data: {' "$TMP/sse" | sed 's/^data: //' | node -e '
  let s = ""; require("readline").createInterface({ input: process.stdin })
    .on("line", (l) => { s += JSON.parse(l).choices[0].text; }).on("close", () => process.stdout.write(s));')
[ "$STREAMED" = "$(node -e 'process.stdout.write(JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0].text)' "$TMP/body")" ] \
  || fail "streamed text differs: $STREAMED"
[ "$(grep '^data: ' "$TMP/sse" | tail -1)" = 'data: [DONE]' ] || fail "ends with [DONE]"
grep '^data: ' "$TMP/sse" | tail -2 | head -1 | grep -q '"finish_reason":"length".*"usage"' || fail "final chunk"
grep -qi '^content-type: text/event-stream' <(curl -sN -D - -o /dev/null "$URL/v1/completions" \
  -d '{"prompt":"Once","max_tokens":2,"stream":true}') || fail "SSE content type"

[ "$(req POST /v1/completions '{"prompt": }')" = 400 ] || fail "bad JSON"
grep -q '"code":"invalid_json"' "$TMP/body" || fail "bad JSON body: $(cat "$TMP/body")"
[ "$(req POST /v1/completions '{"prompt":"a","top_k":"x"}')" = 400 ] || fail "wrong type"
grep -q '"param":"top_k"' "$TMP/body" || fail "names top_k: $(cat "$TMP/body")"
[ "$(req POST /v1/completions '{"prompt":"a","kv_cache":{"windw":8}}')" = 400 ] || fail "unknown kv_cache field"
grep -q '"param":"kv_cache.windw"' "$TMP/body" || fail "names kv_cache.windw: $(cat "$TMP/body")"
head -c 5000000 /dev/zero | tr '\0' ' ' > "$TMP/big"
[ "$(curl -s -o "$TMP/body" -w '%{http_code}' "$URL/v1/completions" --data-binary @"$TMP/big")" = 413 ] || fail "413"
grep -q '"code":"body_too_large"' "$TMP/body" || fail "413 body: $(cat "$TMP/body")"
[ "$(req GET /v1/nope)" = 404 ] || fail 404

curl -s "$URL/metrics" > "$TMP/metrics"
for m in ptllm_requests_running ptllm_requests_queued 'ptllm_requests_rejected_total{reason="queue_full"}' \
         'ptllm_requests_finished_total{reason="length"}' ptllm_prompt_tokens_total ptllm_generation_tokens_total \
         ptllm_time_to_first_token_seconds_count ptllm_inter_token_latency_seconds_count ptllm_batch_size_count \
         ptllm_kv_bytes_reserved ptllm_kv_bytes_in_use ptllm_kv_bytes_budget; do
  grep -q "^$m " "$TMP/metrics" || fail "metric $m"
done
grep -q '^ptllm_generation_tokens_total 26$' "$TMP/metrics" || fail "generated tokens: $(grep generation "$TMP/metrics")"
# bad JSON, wrong type, unknown kv_cache field, 413.
grep -q '^ptllm_requests_rejected_total{reason="invalid"} 4$' "$TMP/metrics" || fail "invalid count: $(grep invalid "$TMP/metrics")"

kill -TERM $PID
wait $PID || fail "exit status after SIGTERM"
echo "serve e2e curl: passed"
