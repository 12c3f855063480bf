#!/usr/bin/env bash
# The compose stack end to end, on any machine with Docker (compose plugin), curl and python3: build and start it
# (every service healthy, the init steps exited 0), trigger digits_tune_from_ui through Airflow's REST API with
# promote on, wait for the run, check the promoted model in S3, then take the stack down (KEEP=1 leaves it up).
# Run from anywhere; reads docker/.env (cp docker/.env.example docker/.env, then set the secrets).
set -euo pipefail

cd "$(dirname "$0")/.."
ENV_FILE=docker/.env
COMPOSE=(docker compose -f docker/docker-compose.yaml --env-file "$ENV_FILE")
API=http://127.0.0.1:8080
DAG=digits_tune_from_ui
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-1200}

die() { echo "smoke: $*" >&2; exit 1; }

[ -f "$ENV_FILE" ] || die "$ENV_FILE is missing: cp docker/.env.example $ENV_FILE and set the secrets"

# One setting from docker/.env (the last assignment wins, as in compose); the file is data, never sourced.
setting() { sed -n "s/^$1=//p" "$ENV_FILE" | tail -n 1; }

json_field() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }

cleanup() {
  status=$?
  if [ "$status" -ne 0 ]; then
    "${COMPOSE[@]}" ps -a || true
    "${COMPOSE[@]}" logs --tail 80 airflow-init airflow-scheduler airflow-triggerer ray-head || true
  fi
  if [ "${KEEP:-0}" != 1 ]; then
    "${COMPOSE[@]}" down -v || true
  fi
  exit "$status"
}
trap cleanup EXIT

echo "smoke: building and starting the stack (waits for every healthcheck)"
"${COMPOSE[@]}" up --build --detach --wait --wait-timeout 600

echo "smoke: logging in to Airflow as admin"
TOKEN=$(python3 -c 'import json, sys; print(json.dumps({"username": "admin", "password": sys.argv[1]}))' \
          "$(setting AIRFLOW_ADMIN_PASSWORD)" \
        | curl --silent --show-error --fail -X POST "$API/auth/token" -H 'Content-Type: application/json' -d @- \
        | json_field access_token)
auth=(-H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json')

echo "smoke: waiting for the dag processor to parse $DAG"
for _ in $(seq 1 60); do
  if curl --silent --fail "${auth[@]}" "$API/api/v2/dags/$DAG" >/dev/null; then break; fi
  sleep 5
done
for dag in "$DAG" digits_deploy_on_promotion; do
  curl --silent --show-error --fail "${auth[@]}" -X PATCH "$API/api/v2/dags/$dag" -d '{"is_paused": false}' >/dev/null
done

echo "smoke: triggering $DAG (promote: true)"
RUN_ID=$(curl --silent --show-error --fail "${auth[@]}" -X POST "$API/api/v2/dags/$DAG/dagRuns" \
  -d '{"logical_date": null, "conf": {"num_samples": 2, "max_steps": 2, "promote": true}}' | json_field dag_run_id)
echo "smoke: run $RUN_ID"

deadline=$((SECONDS + RUN_TIMEOUT_S))
state=queued
while [ "$SECONDS" -lt "$deadline" ]; do
  state=$(curl --silent --show-error --fail "${auth[@]}" "$API/api/v2/dags/$DAG/dagRuns/$RUN_ID" | json_field state)
  case "$state" in
    success) break ;;
    failed) die "run $RUN_ID failed (see the task logs in the UI)" ;;
  esac
  sleep 10
done
[ "$state" = success ] || die "run $RUN_ID is still $state after ${RUN_TIMEOUT_S}s"

echo "smoke: checking the promoted model in S3"
# Inside the stack (S3 is not published on the host), with the same reader the deploy DAG uses.
"${COMPOSE[@]}" exec -T airflow-scheduler python -c '
import os, sys
from airflow_tune.registries.s3 import read_champion
champion = read_champion(os.environ["AIRFLOW_TUNE_REGISTRY_URI"])
if not champion:
    sys.exit("no champion.json under " + os.environ["AIRFLOW_TUNE_REGISTRY_URI"])
print("promoted:", champion)
'
echo "smoke: passed"
