#!/usr/bin/env bash
# Builds the container image from deploy/Dockerfile and exercises it (issue 17). Run as root
# from anywhere in the repository; `.ci/run` runs it. Needs: Debian (apt), curl, cargo.
#
#   deploy/test-image.sh            # build patterd:test and check it
#
# What it does, in order:
#  1. installs Debian's docker.io, debootstrap and docker-compose when missing;
#  2. starts dockerd when none answers (and stops it again on exit);
#  3. base images: pulls rust:1.95-bookworm and debian:bookworm-slim when PATTERD_PULL_BASES=1,
#     else makes local stand-ins (kept between runs, as is Docker's layer cache):
#       patterd-local/debian:bookworm-slim  debootstrap --variant=minbase bookworm | docker import
#       patterd-local/rust:1.95-bookworm    that + gcc, the host's Rust toolchain and the crates of
#                                           Cargo.lock from `cargo vendor` (CARGO_HOME points
#                                           crates-io at them), so the build stage needs no network
#     and passes them to deploy/Dockerfile as --build-arg RUST_IMAGE / RUNTIME_IMAGE (the only
#     override; the Dockerfile is otherwise what a user with internet access builds);
#  4. builds patterd:test and checks: it refuses to start without PATTERD_API_TOKEN (one line
#     naming it); non-root; /healthz through a published port; /v1/calls needs the token; a
#     signed Twilio webhook from the host is answered with TwiML and a forged one refused; the
#     HEALTHCHECK reports healthy; `docker stop` drains and exits 0 within the compose file's
#     stop_grace_period; the data volume keeps the store across a restart; `docker-compose
#     config` accepts deploy/docker-compose.yml with deploy/.env.example;
#  5. removes its containers, volume and the dangling images it left, and stops the dockerd it
#     started.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

IMAGE=${PATTERD_TEST_IMAGE:-patterd:test}
RUST_BASE=patterd-local/rust:1.95-bookworm
RUNTIME_BASE=patterd-local/debian:bookworm-slim
MIRROR=${PATTERD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NAME=patterd-test-$$
VOLUME=patterd-test-data-$$
TOKEN=image-test-token-0123456789abcdef-$$
TW_SID=AC00000000000000000000000000000017
TW_TOKEN=image-test-twilio-auth-token
PUBLIC_URL=https://voice.example.test
export DOCKER_BUILDKIT=0 # the classic builder: the same with Debian's docker.io and newer CLIs

WORK=$(mktemp -d)
DOCKERD_PID=""
started=$(date +%s)
say() { printf '== [%3ss] %s\n' "$(($(date +%s) - started))" "$*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

cleanup() {
  local rc=$?
  set +e
  if docker info >/dev/null 2>&1; then
    docker rm -f "$NAME" "$NAME-b" >/dev/null 2>&1
    docker volume rm -f "$VOLUME" >/dev/null 2>&1
    local dangling
    dangling=$(docker images -q --filter dangling=true --filter "label=org.patterd.test-image=1")
    [ -n "$dangling" ] && docker rmi $dangling >/dev/null 2>&1
  fi
  if [ -n "$DOCKERD_PID" ]; then
    kill "$DOCKERD_PID" 2>/dev/null
    wait "$DOCKERD_PID" 2>/dev/null
    echo "== stopped the dockerd this script started"
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT

# 1. Tools.
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v docker-compose >/dev/null || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]} (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi

# 2. The engine.
if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (log: $WORK/dockerd.log)"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || { cat "$WORK/dockerd.log" >&2; fail "dockerd exited"; }
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log" >&2; fail "dockerd did not answer in 60 s"; }
fi

# 3. Base images.
if [ "${PATTERD_PULL_BASES:-0}" = 1 ]; then
  say "pulling the base images"
  docker pull -q rust:1.95-bookworm >/dev/null && docker pull -q debian:bookworm-slim >/dev/null
  BUILD_ARGS=()
else
  if ! docker image inspect "$RUNTIME_BASE" >/dev/null 2>&1; then
    say "making $RUNTIME_BASE with debootstrap from $MIRROR"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
      { tail -20 "$WORK/debootstrap.log" >&2; fail "debootstrap failed"; }
    # What debian:bookworm-slim also leaves out: package lists, caches, documentation.
    rm -rf "$WORK"/rootfs/var/lib/apt/lists/* "$WORK"/rootfs/var/cache/apt/* \
      "$WORK"/rootfs/usr/share/doc/* "$WORK"/rootfs/usr/share/man/* "$WORK"/rootfs/usr/share/info/*
    tar -C "$WORK/rootfs" -c . | docker import -c 'CMD ["bash"]' - "$RUNTIME_BASE" >/dev/null
    rm -rf "$WORK/rootfs"
  fi
  say "making $RUST_BASE (host toolchain + cargo vendor)"
  sysroot=$(rustc +1.95 --print sysroot 2>/dev/null || rustc --print sysroot)
  case "$("$sysroot/bin/rustc" --version)" in
    "rustc 1.95."*) ;;
    *) fail "the build stage needs Rust 1.95 (rust:1.95-bookworm); $sysroot has $("$sysroot/bin/rustc" --version)" ;;
  esac
  ctx=$WORK/rust-base
  mkdir -p "$ctx/toolchain"
  for d in bin lib libexec etc; do
    [ -d "$sysroot/$d" ] && { cp -al "$sysroot/$d" "$ctx/toolchain/" 2>/dev/null || cp -a "$sysroot/$d" "$ctx/toolchain/"; }
  done
  cargo vendor --locked --versioned-dirs -q "$ctx/vendor" >/dev/null
  cat >"$ctx/config.toml" <<'EOF'
[source.crates-io]
replace-with = "vendored"
[source.vendored]
directory = "/usr/local/cargo/vendor"
[net]
offline = true
EOF
  cat >"$ctx/Dockerfile" <<EOF
FROM $RUNTIME_BASE
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev binutils \\
 && rm -rf /var/lib/apt/lists/*
COPY toolchain /usr/local/rust
ENV PATH=/usr/local/rust/bin:\$PATH CARGO_HOME=/usr/local/cargo
COPY config.toml /usr/local/cargo/config.toml
COPY vendor /usr/local/cargo/vendor
EOF
  docker build --label org.patterd.test-image=1 -t "$RUST_BASE" "$ctx" >"$WORK/rust-base.log" 2>&1 ||
    { tail -40 "$WORK/rust-base.log" >&2; fail "docker build ($RUST_BASE)"; }
  rm -rf "$ctx"
  BUILD_ARGS=(--build-arg "RUST_IMAGE=$RUST_BASE" --build-arg "RUNTIME_IMAGE=$RUNTIME_BASE")
fi

# 4. The image.
# The image's cargo profile: `image-test` unless PATTERD_IMAGE_PROFILE says otherwise (e.g.
# `release`, the Dockerfile's default, to test the very build users get).
BUILD_ARGS+=(--build-arg "CARGO_PROFILE=${PATTERD_IMAGE_PROFILE:-image-test}")
say "building $IMAGE from deploy/Dockerfile (profile ${PATTERD_IMAGE_PROFILE:-image-test})"
build_started=$(date +%s)
docker build --label org.patterd.test-image=1 "${BUILD_ARGS[@]}" -f deploy/Dockerfile -t "$IMAGE" . \
  >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; fail "docker build (deploy/Dockerfile)"; }
say "built in $(($(date +%s) - build_started)) s; size $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f MB", $1/1e6}')"

say "check: without PATTERD_API_TOKEN it refuses to start, naming it"
set +e
out=$(docker run --rm "$IMAGE" 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "started without PATTERD_API_TOKEN"
echo "   $out"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "expected one line, got: $out"
grep -q PATTERD_API_TOKEN <<<"$out" || fail "the refusal does not name PATTERD_API_TOKEN: $out"

# A grace period like the compose file's; the container's drain_timeout_s stays below it.
GRACE=$(sed -n 's/^ *stop_grace_period: *\([0-9]*\)s.*/\1/p' deploy/docker-compose.yml)
[ -n "$GRACE" ] || fail "no stop_grace_period in deploy/docker-compose.yml"

run_container() { # NAME
  docker run -d --name "$1" -p 127.0.0.1::8080 -v "$VOLUME:/var/lib/patterd" \
    --health-interval=1s --health-start-period=30s \
    -e PATTERD_API_TOKEN="$TOKEN" -e PATTERD_SERVER__PUBLIC_URL="$PUBLIC_URL" \
    -e TWILIO_ACCOUNT_SID="$TW_SID" -e TWILIO_AUTH_TOKEN="$TW_TOKEN" \
    "$IMAGE" >/dev/null
  PORT=$(docker port "$1" 8080/tcp | head -1 | sed 's/.*://')
  BASE=http://127.0.0.1:$PORT
  for _ in $(seq 1 100); do
    curl -fsS "$BASE/healthz" >/dev/null 2>&1 && return 0
    [ "$(docker inspect -f '{{.State.Running}}' "$1")" = true ] || { docker logs "$1" >&2; fail "$1 exited"; }
    sleep 0.2
  done
  docker logs "$1" >&2
  fail "$1: /healthz did not answer through the published port"
}

say "starting $NAME (published on a free loopback port)"
docker volume create "$VOLUME" >/dev/null
run_container "$NAME"

say "check: the process runs as a non-root user"
uid=$(docker top "$NAME" -o pid,uid,comm | awk '$3 == "patterd" {print $2}')
[ -n "$uid" ] && [ "$uid" != 0 ] || fail "patterd runs as uid '${uid:-?}'"
[ "$(docker inspect -f '{{.Config.User}}' "$IMAGE")" = patterd ] || fail "image USER is not patterd"
echo "   uid $uid"

say "check: /healthz answers through the published port $PORT"
[ "$(curl -sS "$BASE/healthz")" = ok ] || fail "/healthz"

say "check: /v1/calls needs the token"
code=$(curl -sS -o /dev/null -w '%{http_code}' "$BASE/v1/calls")
[ "$code" = 401 ] || fail "/v1/calls without the token answered $code"
code=$(curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong" "$BASE/v1/calls")
[ "$code" = 401 ] || fail "/v1/calls with a wrong token answered $code"
code=$(curl -sS -o "$WORK/calls.json" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" "$BASE/v1/calls")
[ "$code" = 200 ] || fail "/v1/calls with the token answered $code"

say "check: a signed Twilio webhook from the host reaches it (patterd-sim's signer)"
cargo run -q -p patterd-sim --example twilio_webhook -- \
  --base "$BASE" --public-url "$PUBLIC_URL" --account-sid "$TW_SID" --auth-token "$TW_TOKEN" \
  --to +15550001234 --from +15557654321 >"$WORK/webhook.out" || { cat "$WORK/webhook.out"; fail "webhook"; }
sed 's/^/   /' "$WORK/webhook.out"

say "check: the HEALTHCHECK (patterd healthcheck) reports healthy"
for _ in $(seq 1 60); do
  h=$(docker inspect -f '{{.State.Health.Status}}' "$NAME")
  [ "$h" = healthy ] && break
  [ "$h" = unhealthy ] && { docker inspect -f '{{json .State.Health}}' "$NAME" >&2; fail "unhealthy"; }
  sleep 0.5
done
[ "$h" = healthy ] || fail "health status stayed '$h'"
docker exec "$NAME" patterd healthcheck | sed 's/^/   /'

# The webhook's call, as the store lists it before the restart.
curl -fsS -H "Authorization: Bearer $TOKEN" "$BASE/v1/calls" >"$WORK/calls.json"
CALL_IDS=$(grep -o '"call_id": *"[^"]*"' "$WORK/calls.json" | sort -u)
[ -n "$CALL_IDS" ] || fail "the webhook's call is not in /v1/calls: $(cat "$WORK/calls.json")"
say "check: docker stop drains and exits 0 within stop_grace_period (${GRACE}s)"
t0=$(date +%s%N)
docker stop -t "$GRACE" "$NAME" >/dev/null
t1=$(date +%s%N)
code=$(docker inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || { docker logs "$NAME" >&2; fail "exit code $code after docker stop"; }
# The log driver may still be copying the last lines when `docker stop` returns: look again
# for up to 5 s before calling the line missing.
drained=""
for _ in $(seq 1 10); do
  docker logs "$NAME" 2>&1 | grep -qi drain && { drained=1; break; }
  sleep 0.5
done
[ -n "$drained" ] || { docker logs "$NAME" 2>&1 | tail -n 20 >&2; fail "no drain in the log"; }
echo "   exit 0 after $(((t1 - t0) / 1000000)) ms"

say "check: the data volume keeps the store across a restart"
docker rm "$NAME" >/dev/null
run_container "$NAME-b"
curl -fsS -H "Authorization: Bearer $TOKEN" "$BASE/v1/calls" >"$WORK/calls-after.json"
[ "$(grep -o '"call_id": *"[^"]*"' "$WORK/calls-after.json" | sort -u)" = "$CALL_IDS" ] ||
  fail "the store lost calls across the restart: before $CALL_IDS, after $(cat "$WORK/calls-after.json")"
echo "   still there: $CALL_IDS"
docker stop -t "$GRACE" "$NAME-b" >/dev/null

say "check: docker-compose config accepts deploy/docker-compose.yml with deploy/.env.example"
docker-compose --env-file deploy/.env.example -f deploy/docker-compose.yml config >"$WORK/compose.out" ||
  fail "docker-compose config"
for v in $(grep -o '^[A-Z_]*=' deploy/.env.example | tr -d =); do
  grep -q "\${$v[:}]" deploy/docker-compose.yml || fail "$v is in .env.example but not used by the compose file"
done
for v in $(grep -o '\${[A-Z_]*' deploy/docker-compose.yml | tr -d '${' | sort -u); do
  grep -q "^$v=" deploy/.env.example || fail "the compose file uses $v but deploy/.env.example does not list it"
done

say "check: a whole simulated call through the container (patterd-loadgen, fakes on the host)"
# The fakes listen on the host's 127.0.0.1, which a container reaches only on the host network;
# the load generator starts this command as its server and drives one Twilio call through it.
cat >"$WORK/call.toml" <<'EOF'
# Written by deploy/test-image.sh: the load generator's fakes, from its BENCH_* variables.
[server]
listen = "127.0.0.1:${BENCH_PORT}"
public_url = "${BENCH_PUBLIC_URL}"
api_token = "${PATTERD_API_TOKEN}"
drain_timeout_s = 5
[llm.hermes]
kind = "hermes"
base_url = "${BENCH_HERMES_URL}"
api_key = "${BENCH_HERMES_KEY}"
model = "hermes-agent"
[stt.deepgram]
kind = "deepgram"
api_key = "${BENCH_DEEPGRAM_KEY}"
base_url = "${BENCH_DEEPGRAM_URL}"
[tts.elevenlabs]
kind = "elevenlabs"
api_key = "${BENCH_ELEVENLABS_KEY}"
voice_id = "voice123"
base_url = "${BENCH_ELEVENLABS_URL}"
[carriers.twilio]
kind = "twilio"
account_sid = "${BENCH_ACCOUNT_SID}"
auth_token = "${BENCH_AUTH_TOKEN}"
api_base_url = "${BENCH_TWILIO_REST_URL}"
[agents.bench]
system_prompt = "You are a test agent."
first_message = "Hello, thanks for calling."
llm = "hermes"
stt = "deepgram"
tts = "elevenlabs"
[[numbers]]
number = "${BENCH_NUMBER}"
carrier = "twilio"
agent = "bench"
EOF
chmod 644 "$WORK/call.toml"
pass_env=""
for v in PORT PUBLIC_URL ACCOUNT_SID AUTH_TOKEN NUMBER DEEPGRAM_URL DEEPGRAM_KEY ELEVENLABS_URL \
  ELEVENLABS_KEY HERMES_URL HERMES_KEY TWILIO_REST_URL; do pass_env="$pass_env -e BENCH_$v"; done
server_cmd="exec docker run --rm --name $NAME-call --network host $pass_env \
  -e PATTERD_API_TOKEN=$TOKEN -e PATTERD_SERVER__LISTEN=127.0.0.1:\$BENCH_PORT \
  -v $WORK/call.toml:/etc/patterd/call.toml:ro \
  $IMAGE run --config /etc/patterd/call.toml"
cargo run -q -p patterd-loadgen -- --server-cmd "$server_cmd" --label container --calls 1 \
  --hold-s 4 --json "$WORK/call.json" --log-dir "$WORK" >"$WORK/loadgen.out" 2>&1 ||
  { cat "$WORK/loadgen.out" >&2; fail "patterd-loadgen"; }
python3 - "$WORK/call.json" <<'EOF' || { cat "$WORK/loadgen.out" "$WORK"/container-1.log >&2; fail "the simulated call"; }
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r) == 1, "no run report"
r = r[0]
print(f"   completed {r['completed_calls']}, failed {r['failed_calls']}, turns answered "
      f"{r['turns_answered']}/{r['turns']}, frames received {r['frames_received']}")
assert r["completed_calls"] == 1 and r["failed_calls"] == 0, r["errors"]
assert r["turns"] >= 1 and r["turns_answered"] == r["turns"] and r["turns_missing"] == 0
assert r["frames_received"] > 0
EOF

say "PASS: image $IMAGE, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f MB", $1/1e6}'), all checks in $(($(date +%s) - started)) s"
