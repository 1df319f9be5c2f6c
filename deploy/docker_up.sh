#!/usr/bin/env bash
# The towerps cluster as containers (deploy/docker-compose.yml: 2 ps, 2
# workers, worker 0 the chief). Starts the Docker engine if it is not running,
# builds the base image (debootstrap, once) and the towerps image (CPU-only,
# deploy/Dockerfile), brings the cluster up and waits until every service is
# healthy.
#
#   deploy/docker_up.sh [--host-network] [--project=NAME]   # up (builds what is missing)
#   deploy/docker_up.sh --down [--volumes] [--host-network] [--project=NAME]
#   deploy/docker_up.sh --build-only                         # engine + images, no cluster
#   deploy/docker_up.sh --engine-only                        # just start the engine
#   deploy/docker_up.sh --stop-engine                        # stop the dockerd this script started
#
# --host-network adds deploy/docker-compose.host.yml: every service on the
# host's network, one loopback port each (TOWERPS_PS0_PORT, TOWERPS_PS1_PORT,
# TOWERPS_WORKER0_PORT, TOWERPS_WORKER1_PORT; defaults 22220..22223). Use it
# where Docker's bridge network is not available (dockerd --bridge=none).
# Submit the default job from the host once it is up:
#   towerctl --chief=127.0.0.1:22222 submit deploy/jobs/mlp.json --wait        # --host-network
#     after `. deploy/secrets/towerctl.env` (TLS and token, see below)
#   docker-compose -p towerps -f deploy/docker-compose.yml exec worker0 \
#     towerctl --chief=worker0:2222 submit /usr/share/towerps/jobs/mlp.json --wait
#
# The engine is started as `dockerd --bridge=none --iptables=false` (root
# needed; log in /var/log/towerps-dockerd.log). Missing packages (docker.io,
# docker-compose, debootstrap) come from `deploy/setup.sh --docker`.
# Every channel is mutual TLS with a bearer token: the certificates and the
# token are made by deploy/make_certs.sh into $TOWERPS_SECRETS_DIR (default
# deploy/secrets) when they are missing, and kept for the next run.
# Environment: TOWERPS_BIN_DIR=<dir with ps/ps, worker/worker,
# client/towerctl built with --config=cpu_image> skips the Bazel build;
# TOWERPS_IMAGE (default towerps:latest); TOWERPS_DEBIAN_MIRROR (default
# http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,32p' "$0"; }
die() { echo "docker_up: $*" >&2; exit 1; }

ACTION=up HOST_NET=0 PROJECT=towerps VOLUMES=0
while [ $# -gt 0 ]; do
  case "$1" in
    --host-network) HOST_NET=1 ;;
    --project=*) PROJECT="${1#*=}" ;;
    --down) ACTION=down ;;
    --volumes) VOLUMES=1 ;;
    --build-only) ACTION=build ;;
    --engine-only) ACTION=engine ;;
    --stop-engine) ACTION=stop-engine ;;
    -h|--help) usage; exit 0 ;;
    *) echo "docker_up: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ "$PROJECT" =~ ^[a-z0-9][a-z0-9_-]*$ ]] \
  || { echo "docker_up: --project must be lowercase letters, digits, '-' or '_', got '$PROJECT'" >&2; exit 2; }
[ "$VOLUMES" = 0 ] || [ "$ACTION" = down ] || { echo "docker_up: --volumes goes with --down" >&2; exit 2; }

IMAGE="${TOWERPS_IMAGE:-towerps:latest}"
SECRETS="${TOWERPS_SECRETS_DIR:-$PWD/deploy/secrets}"
case "$SECRETS" in /*) ;; *) SECRETS="$PWD/$SECRETS" ;; esac
export TOWERPS_SECRETS_DIR="$SECRETS"  # read by the compose file
export TOWERPS_IMAGE="$IMAGE"  # read by the compose file
BASE_IMAGE=towerps-base:bookworm
MIRROR="${TOWERPS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ENGINE_LOG=/var/log/towerps-dockerd.log
ENGINE_PID=/run/towerps-dockerd.pid
# The client that comes with Debian's engine (another `docker` earlier in
# PATH may be much newer than the daemon).
DOCKER=docker
[ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
COMPOSE=(docker-compose -p "$PROJECT" -f deploy/docker-compose.yml)
[ "$HOST_NET" = 0 ] || COMPOSE+=(-f deploy/docker-compose.host.yml)

TMP_DIRS=()
cleanup() {
  local d m
  for d in "${TMP_DIRS[@]}"; do
    # debootstrap mounts /proc and /sys in its target; never delete through them.
    for m in $(awk -v d="$d" 'index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r); do
      umount -l "$m" 2>/dev/null || true
    done
    rm -rf --one-file-system "$d"
  done
}
trap cleanup EXIT
trap 'echo "docker_up: interrupted" >&2; exit 130' INT TERM

ensure_packages() {
  if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null \
     || ! command -v debootstrap >/dev/null; then
    deploy/setup.sh --docker
  fi
}

engine_running() { "$DOCKER" info >/dev/null 2>&1; }

start_engine() {
  engine_running && return 0
  [ "$(id -u)" -eq 0 ] || die "the Docker engine is not running, and starting it (dockerd) needs root"
  command -v dockerd >/dev/null || die "dockerd is not installed (deploy/setup.sh --docker)"
  echo "docker_up: starting dockerd --bridge=none --iptables=false (log: $ENGINE_LOG)"
  # setsid: the engine outlives this script (and a test's process group).
  setsid dockerd --bridge=none --iptables=false --storage-driver=overlay2 \
    >>"$ENGINE_LOG" 2>&1 </dev/null &
  local pid=$! deadline=$((SECONDS + 60))
  echo "$pid" >"$ENGINE_PID"
  until engine_running; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$ENGINE_PID"
      die "dockerd exited while starting: $(tail -n 1 "$ENGINE_LOG") (log: $ENGINE_LOG)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      kill "$pid" 2>/dev/null || true
      rm -f "$ENGINE_PID"
      die "dockerd did not answer within 60 s: $(tail -n 1 "$ENGINE_LOG") (log: $ENGINE_LOG)"
    fi
    sleep 0.2
  done
}

stop_engine() {
  [ -f "$ENGINE_PID" ] || { echo "docker_up: no dockerd started by this script ($ENGINE_PID)"; return 0; }
  local pid deadline=$((SECONDS + 30))
  pid=$(cat "$ENGINE_PID")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ]; then
    rm -f "$ENGINE_PID"
    echo "docker_up: dockerd $pid is gone"
    return 0
  fi
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "dockerd $pid still running 30 s after SIGTERM"
    sleep 0.2
  done
  rm -f "$ENGINE_PID"
  echo "docker_up: dockerd $pid stopped"
}

# The base image, made once: its label names the recipe, so a changed recipe
# (mirror, suite, sources) makes a new one and an unchanged one is reused.
build_base() {
  local recipe have dir
  recipe="debootstrap --variant=minbase bookworm $MIRROR; sources bookworm bookworm-updates bookworm-security; v1"
  have=$("$DOCKER" image inspect -f '{{index .Config.Labels "towerps.base.recipe"}}' "$BASE_IMAGE" 2>/dev/null || true)
  if [ "$have" = "$recipe" ]; then
    echo "docker_up: base image $BASE_IMAGE present"
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap is not installed (deploy/setup.sh --docker)"
  dir=$(mktemp -d /var/tmp/towerps-base.XXXXXX)
  TMP_DIRS+=("$dir")
  echo "docker_up: making $BASE_IMAGE: debootstrap --variant=minbase bookworm ($MIRROR) ..."
  local start=$SECONDS
  debootstrap --variant=minbase bookworm "$dir/root" "$MIRROR" >"$dir/debootstrap.log" 2>&1 \
    || die "debootstrap failed: $(tail -n 3 "$dir/debootstrap.log" | tr '\n' ' ')"
  cat >"$dir/root/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
  rm -rf "$dir/root/var/cache/apt/archives/"*.deb "$dir/root/var/lib/apt/lists/"* "$dir/root/var/log/"*.log
  tar -C "$dir/root" -c . | "$DOCKER" import \
    --change "LABEL towerps.base.recipe=\"$recipe\"" --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  echo "docker_up: $BASE_IMAGE made in $((SECONDS - start)) s"
}

build_image() {
  local bin ctx
  if [ -n "${TOWERPS_BIN_DIR:-}" ]; then
    bin="$TOWERPS_BIN_DIR"
  else
    command -v bazel >/dev/null || deploy/setup.sh
    echo "docker_up: bazel build --config=cpu_image //ps:ps //worker:worker //client:towerctl ..."
    bazel build --config=cpu_image --ui_event_filters=-info,-stdout --noshow_progress \
      //ps:ps //worker:worker //client:towerctl
    bin="$(bazel info --config=cpu_image bazel-bin 2>/dev/null)"
  fi
  for b in ps/ps worker/worker client/towerctl; do
    [ -x "$bin/$b" ] || die "no $bin/$b (TOWERPS_BIN_DIR must hold ps/ps, worker/worker, client/towerctl)"
  done
  if ldd "$bin/worker/worker" | grep -q 'libcudart'; then
    die "$bin/worker/worker links the CUDA runtime, which the image does not have: build with --config=cpu_image"
  fi
  ctx=$(mktemp -d /var/tmp/towerps-image.XXXXXX)
  TMP_DIRS+=("$ctx")
  cp -L "$bin/ps/ps" "$bin/worker/worker" "$bin/client/towerctl" deploy/Dockerfile "$ctx/"
  mkdir "$ctx/jobs"
  cp -L deploy/jobs/*.json "$ctx/jobs/"
  echo "docker_up: docker build --network host -t $IMAGE ..."
  local start=$SECONDS old
  old=$("$DOCKER" image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  "$DOCKER" build --network host --build-arg BASE="$BASE_IMAGE" -t "$IMAGE" "$ctx" >"$ctx/build.log" 2>&1 \
    || { tail -n 20 "$ctx/build.log" >&2; die "docker build failed"; }
  # The image this tag named before, now untagged: dropped unless in use
  # (its layers shared with the new one stay, as the build cache).
  if [ -n "$old" ] && [ "$old" != "$("$DOCKER" image inspect -f '{{.Id}}' "$IMAGE")" ]; then
    "$DOCKER" rmi "$old" >/dev/null 2>&1 || true
  fi
  echo "docker_up: $IMAGE built in $((SECONDS - start)) s ($("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}'))"
}

# Waits until every service of the project reports healthy (deadline 180 s).
wait_healthy() {
  local deadline=$((SECONDS + 180)) ids states
  while true; do
    ids=$("${COMPOSE[@]}" ps -q)
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086
      states=$("$DOCKER" inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' $ids)
      if ! grep -qv ' healthy$' <<<"$states"; then
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$states" >&2
      "${COMPOSE[@]}" logs --tail=5 >&2 || true
      die "not every service healthy within 180 s"
    fi
    sleep 0.5
  done
}

case "$ACTION" in
  stop-engine) stop_engine; exit 0 ;;
  down)
    engine_running || die "the Docker engine is not running: nothing to bring down"
    args=(down --timeout 30)
    [ "$VOLUMES" = 0 ] || args+=(-v)
    "${COMPOSE[@]}" "${args[@]}"
    exit 0 ;;
esac

ensure_packages
start_engine
[ "$ACTION" = engine ] && exit 0
build_base
build_image
[ "$ACTION" = build ] && exit 0

deploy/make_certs.sh "$SECRETS"
"${COMPOSE[@]}" up -d
wait_healthy
"${COMPOSE[@]}" ps
if [ "$HOST_NET" = 1 ]; then
  chief="127.0.0.1:${TOWERPS_WORKER0_PORT:-22222}"
  echo "docker_up: up (mutual TLS + token); submit from the host with:"
  echo "  . $SECRETS/towerctl.env"
  echo "  towerctl --chief=$chief submit deploy/jobs/mlp.json --wait"
else
  echo "docker_up: up; submit with:"
  echo "  ${COMPOSE[*]} exec worker0 towerctl --chief=worker0:2222 submit /usr/share/towerps/jobs/mlp.json --wait"
fi
