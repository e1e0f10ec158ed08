# Sourced by the scripts that start `posttrainllm serve --port 0` in the background.
# serve_url LOG WHO: waits up to 10 s for the server's "listening on http://HOST:PORT"
# line in LOG (its stderr) and prints the URL; if none comes, says so with the log
# and fails: url=$(serve_url "$log" NAME) || exit 1
serve_url() {
  local log=$1 who=$2 url=""
  for _ in $(seq 100); do
    url=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" 2>/dev/null || true); [ -n "$url" ] && break; sleep 0.1
  done
  [ -n "$url" ] || { echo "$who: server did not start: $(cat "$log")" >&2; return 1; }
  echo "$url"
}
