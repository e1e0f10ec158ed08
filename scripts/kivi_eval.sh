#!/usr/bin/env bash
# KIVI grouped vs simple on flagship-27m, held-out books (docs/EVALUATION.md,
# "KIVI: grouped vs simple"): 64-window perplexity through the cache for every
# mode and both schemes, asymmetric K/V, and 8,192-token streams with sink 4 +
# window 252 (reposition). The commands are the eval_tables.sh sections.
# Usage: scripts/kivi_eval.sh   (env as for eval_tables.sh: BIN, THREADS, KV_WINDOWS)
set -euo pipefail
exec "$(dirname "$0")/eval_tables.sh" flagship-window-kv flagship-8k-kivi
