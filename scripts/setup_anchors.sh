#!/usr/bin/env bash
# Installs the independent references the tests compare against: Node.js (from
# Debian when absent) and the npm packages pinned in tools/anchors/package-lock.json
# (node-llama-cpp = prebuilt llama.cpp, @huggingface/jinja, openai). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
lock=tools/anchors/package-lock.json
stamp=tools/anchors/node_modules/.installed-lock
if [ ! -f "$stamp" ] || ! cmp -s "$lock" "$stamp"; then
  (cd tools/anchors && npm ci --no-audit --no-fund --loglevel=error)
  cp "$lock" "$stamp"
fi
