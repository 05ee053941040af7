#!/usr/bin/env bash
# The reward server's cluster commands, each written once. The manifests call this script
# (deploy/ray_cluster.yaml, deploy/kuberay/rayservice.yaml), README.md quotes it, and
# tests/e2e/test_cluster_commands.py runs the manifests' lines that call it, on one machine.
#
#   deploy/commands.sh head [ray start flags]          a Ray head (`ray up`'s head node)
#   deploy/commands.sh worker [ray start flags]        a Ray node joining $RAY_HEAD_ADDRESS
#   deploy/commands.sh serve-deploy [serve deploy flags]   the engine applications (serve_config.yaml)
#   deploy/commands.sh ingress [reward-server serve flags] the gRPC + HTTP ingress, attached to them
#   deploy/commands.sh ingress-node [ray start flags]  join as a 0-CPU/0-GPU node, then `ingress`
#                                                      (KubeRay's ingress pods: one per pod)
#
# Token auth, everywhere: Ray 2.60 clusters require a token. Every command here needs
#   RAY_AUTH_MODE=token and the cluster's token as RAY_AUTH_TOKEN (KubeRay: from the Secret
#   ray-auth-token) or RAY_AUTH_TOKEN_PATH (`ray up`: the file that file_mounts syncs to every
#   node); it refuses to start without one, and a worker whose token the head refuses stops in
#   seconds with one line. The reward server's own bearer token is a file, named by
#   REWARD_SERVER_TOKEN_FILE (`ray up`: synced by file_mounts; KubeRay: the Secret
#   reward-server-token mounted as a file), read by the ingress and the trainer alike; the token
#   itself is in no environment variable. Token files of this user that others can read are
#   made 0600 (`ray get-auth-token --generate` writes ~/.ray/auth_token 0644).
#
# Settings (environment; the defaults are the manifests'):
#   RAY_HEAD_ADDRESS       host:port of the head's GCS for worker / ingress-node ($RAY_HEAD_IP:$RAY_PORT)
#   RAY_PORT               the head's GCS port (6379)
#   RAY_DASHBOARD_ADDRESS  where serve-deploy sends the config (http://127.0.0.1:8265: run it on the head)
#   REWARD_SERVER_CONFIG   the reward-server config (/etc/reward-server/config.yaml)
#   SERVE_CONFIG           the Serve config (the directory of this script/serve_config.yaml)
#   REWARD_SERVER_HOST / REWARD_SERVER_PORT   the ingress's gRPC address (0.0.0.0 / 50051)
#   REWARD_SERVER_TOKEN_FILE  the file holding the server's bearer token (REWARD_SERVER_TOKEN,
#                          the value itself, wins when set)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REWARD_SERVER_CONFIG="${REWARD_SERVER_CONFIG:-/etc/reward-server/config.yaml}"
SERVE_CONFIG="${SERVE_CONFIG:-$HERE/serve_config.yaml}"

private_file() {  # a token file of this user that others can read becomes 0600
    if [[ -f "$1" && -O "$1" && -n "$(find "$1" -maxdepth 0 -perm /077)" ]]; then
        chmod 600 "$1"
        echo "deploy/commands.sh: $1 was readable by other users; made it 0600" >&2
    fi
}

need_ray_token() {
    export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
    if [[ "$RAY_AUTH_MODE" == "token" && -z "${RAY_AUTH_TOKEN:-}" ]]; then
        local path="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
        if [[ ! -r "$path" ]]; then
            echo "error: deploy/commands.sh $1: Ray token auth is on (RAY_AUTH_MODE=token) but there" \
                 "is no token: set RAY_AUTH_TOKEN (KubeRay: secretKeyRef ray-auth-token/token) or" \
                 "RAY_AUTH_TOKEN_PATH to a readable file (ray up: file_mounts); \`ray get-auth-token" \
                 "--generate\` makes one" >&2
            exit 2
        fi
        private_file "$path"
    fi
}

head_accepts_token() {
    # `ray start --address` retries a refused token for ~20 s and ends in a traceback; one
    # `ray health-check` says InvalidAuthToken in seconds. Any other outcome (the head not up
    # yet, ...) is left to ray start, which waits for the head.
    local out rc=0
    out="$(timeout 20 ray health-check --address "$RAY_HEAD_ADDRESS" --skip-version-check 2>&1)" || rc=$?
    if [[ $rc != 0 ]] && grep -q "InvalidAuthToken" <<<"$out"; then
        echo "error: deploy/commands.sh $1: the head at $RAY_HEAD_ADDRESS refused this node's Ray" \
             "token (InvalidAuthToken): give every node the head's token (RAY_AUTH_TOKEN or" \
             "RAY_AUTH_TOKEN_PATH; ray up: the file_mounts copy of ~/.ray/auth_token; KubeRay: the" \
             "Secret ray-auth-token)" >&2
        exit 2
    fi
}

need_head_address() {
    # ray up sets RAY_HEAD_IP on worker nodes; KubeRay pods get RAY_HEAD_ADDRESS from the manifest
    if [[ -z "${RAY_HEAD_ADDRESS:-}" && -n "${RAY_HEAD_IP:-}" ]]; then
        RAY_HEAD_ADDRESS="$RAY_HEAD_IP:${RAY_PORT:-6379}"
    fi
    if [[ -z "${RAY_HEAD_ADDRESS:-}" ]]; then
        echo "error: deploy/commands.sh $1: set RAY_HEAD_ADDRESS to the head's GCS host:port" \
             "(ray up sets RAY_HEAD_IP, the port is RAY_PORT, 6379; KubeRay: reward-server-head-svc:6379)" >&2
        exit 2
    fi
}

cmd="${1:-}"
shift || true
case "$cmd" in
    head)
        need_ray_token head
        exec ray start --head --port="${RAY_PORT:-6379}" --dashboard-host=0.0.0.0 \
            --disable-usage-stats "$@"
        ;;
    worker)
        need_ray_token worker
        need_head_address worker
        head_accepts_token worker
        exec ray start --address="$RAY_HEAD_ADDRESS" --disable-usage-stats "$@"
        ;;
    serve-deploy)
        need_ray_token serve-deploy
        exec serve deploy "$SERVE_CONFIG" --address "${RAY_DASHBOARD_ADDRESS:-http://127.0.0.1:8265}" "$@"
        ;;
    ingress)
        need_ray_token ingress
        if [[ -n "${REWARD_SERVER_TOKEN_FILE:-}" ]]; then
            private_file "$REWARD_SERVER_TOKEN_FILE"  # reward-server serve reads it
        elif [[ -z "${REWARD_SERVER_TOKEN:-}" ]]; then
            echo "warning: deploy/commands.sh ingress: no REWARD_SERVER_TOKEN_FILE (nor" \
                 "REWARD_SERVER_TOKEN): the server accepts calls without a token" >&2
        fi
        exec reward-server serve --config "$REWARD_SERVER_CONFIG" \
            --host "${REWARD_SERVER_HOST:-0.0.0.0}" --port "${REWARD_SERVER_PORT:-50051}" "$@"
        ;;
    ingress-node)
        need_ray_token ingress-node
        need_head_address ingress-node
        head_accepts_token ingress-node
        ray start --address="$RAY_HEAD_ADDRESS" --num-cpus=0 --num-gpus=0 --disable-usage-stats "$@"
        exec "$HERE/commands.sh" ingress
        ;;
    *)
        sed -n '2,12p' "${BASH_SOURCE[0]}" >&2
        exit 2
        ;;
esac
