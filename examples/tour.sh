#!/usr/bin/env bash
# The README's quick tour, run as written, against a stack from `swarm up` (SWARM_GATEWAY_URL,
# else http://localhost:8080). Run it from anywhere: `examples/tour.sh`. No admin key is
# needed on a local stack; elsewhere set SWARM_API_KEY to an admin's. tests/sdk/test_tour.py
# runs it on every `make test`.
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { printf '\n== %s\n' "$*"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

say "a base model, registered"
# --random: an untrained model, made at once (without it: pretrained, about 2 CPU-minutes)
swarm models create-tiny --random "$work/tiny"
swarm models add tiny-llama "$work/tiny"

say "a dataset: its id is its content's digest (the one job.yaml names)"
ds=$(swarm datasets upload data.jsonl --json | field '["id"]')
grep -q "dataset: $ds" job.yaml
swarm datasets stats "$ds" --model tiny-llama

say "a job, followed to its end"
swarm jobs estimate job.yaml
swarm submit job.yaml --follow --idempotency-key tour-job
job=$(swarm jobs --json | field '[0]["job_id"]')
swarm jobs
swarm jobs show "$job" --plot "$work/loss.png"
test -s "$work/loss.png"
swarm jobs events "$job" --json > "$work/events.jsonl"
grep -q '"succeeded"' "$work/events.jsonl"

say "the adapter: by name, version and alias"
swarm adapters
swarm adapters alias support-bot production 1
for ref in support-bot support-bot@1 support-bot@production; do
  swarm adapters show "$ref" --json | field '["version"]'
done
swarm adapters pull support-bot@production --with-base --out "$work/bot"
test -f "$work/bot/adapter_model.safetensors"
test -f "$work/bot/base/config.json"

say "workers"
swarm workers

say "a sweep, followed to its end"
swarm sweep run sweep.yaml --follow --idempotency-key tour-sweep
swarm sweeps

say "chat with the adapter"
swarm chat support-bot@production -p "Reverse the word: river" --max-tokens 8 --json
