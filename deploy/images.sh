#!/usr/bin/env bash
# The two images and the manifests that name them, kept to one name each.
#   deploy/images.sh current                   the serving image the manifests name now
#   deploy/images.sh build IMAGE [EXTRAS]      docker/podman build -f deploy/Dockerfile -t IMAGE
#   deploy/images.sh push IMAGE...             push them (never the ghcr.io/example placeholder)
#   deploy/images.sh check IMAGE IMAGE_TRAIN   every manifest image line is one of the two
#   deploy/images.sh set IMAGE IMAGE_TRAIN     write the two names into every manifest
# The Makefile's targets call it (make image, image-train, image-push, images-check, images-set,
# images-lint). The name is set once, `make images-set IMAGE=<registry>/reward-server:<tag>`:
# the manifests then hold it and the Makefile reads it back from them (`current`).
# The serving image goes to deploy/ray_cluster.yaml and deploy/kuberay/rayservice.yaml, the
# training image (EXTRAS=train,rollout,trl) to deploy/kuberay/rayjob.yaml.
# Without a working docker or podman, build and push fail (exit 3) with one line saying so.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
SERVING=("$HERE/ray_cluster.yaml" "$HERE/kuberay/rayservice.yaml")
TRAINING=("$HERE/kuberay/rayjob.yaml")
PLACEHOLDER="ghcr.io/example/"

engine() {  # $1: what needs it (build, push)
    local e found=""
    for e in docker podman; do
        command -v "$e" >/dev/null 2>&1 || continue
        found="$found $e"
        if "$e" info >/dev/null 2>&1; then echo "$e"; return 0; fi
    done
    if [[ -z "$found" ]]; then
        echo "error: deploy/images.sh $1: neither docker nor podman is installed here; install" \
             "one (or run this make target on a machine that has one)" >&2
    else
        echo "error: deploy/images.sh $1: ${found# } is installed but \`${found# } info\` fails" \
             "(no daemon answers): start it (e.g. sudo systemctl start docker) or run this make" \
             "target on a machine where it runs" >&2
    fi
    return 3
}

refuse_placeholder() {  # $@: image names about to leave this machine
    local image
    for image in "$@"; do
        if [[ "$image" == "$PLACEHOLDER"* ]]; then
            echo "error: deploy/images.sh push: $image is the placeholder name; set your registry" \
                 "once with \`make images-set IMAGE=<registry>/reward-server:<tag>\` (writes it into" \
                 "every manifest; make image, image-train and image-push then use it)" >&2
            exit 2
        fi
    done
}

# the image names a manifest uses: lines `image: NAME` (YAML) in it
images_in() { sed -nE 's/^[[:space:]-]*image:[[:space:]]*"?([^"#[:space:]]+)"?.*$/\1/p' "$1"; }

cmd="${1:-}"; shift || true
case "$cmd" in
    current)
        images_in "${SERVING[0]}" | head -n 1
        ;;
    build)
        image="${1:?IMAGE}"; extras="${2:-server,gpu}"
        tool="$(engine build)" || exit 3
        exec "$tool" build -f "$ROOT/deploy/Dockerfile" --build-arg "EXTRAS=$extras" -t "$image" "$ROOT"
        ;;
    push)
        [[ $# -gt 0 ]] || { echo "error: deploy/images.sh push: name the images" >&2; exit 2; }
        refuse_placeholder "$@"
        tool="$(engine push)" || exit 3
        for image in "$@"; do "$tool" push "$image"; done
        ;;
    check)
        serving="${1:?IMAGE}"; training="${2:?IMAGE_TRAIN}"; bad=0
        for f in "${SERVING[@]}"; do
            while read -r name; do
                [[ "$name" == "$serving" ]] || { echo "$f: image $name, not IMAGE=$serving" >&2; bad=1; }
            done < <(images_in "$f")
        done
        for f in "${TRAINING[@]}"; do
            while read -r name; do
                [[ "$name" == "$training" ]] || { echo "$f: image $name, not IMAGE_TRAIN=$training" >&2; bad=1; }
            done < <(images_in "$f")
        done
        [[ $bad == 0 ]] && echo "every manifest names IMAGE=$serving / IMAGE_TRAIN=$training"
        exit $bad
        ;;
    set)
        serving="${1:?IMAGE}"; training="${2:?IMAGE_TRAIN}"
        for f in "${SERVING[@]}"; do
            sed -i -E "s#^([[:space:]-]*image:[[:space:]]*)[^[:space:]\#]+#\1$serving#" "$f"
        done
        for f in "${TRAINING[@]}"; do
            sed -i -E "s#^([[:space:]-]*image:[[:space:]]*)[^[:space:]\#]+#\1$training#" "$f"
        done
        exec "$0" check "$serving" "$training"
        ;;
    *)
        sed -n '2,13p' "${BASH_SOURCE[0]}" >&2
        exit 2
        ;;
esac
