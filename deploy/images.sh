#!/usr/bin/env bash
# The two images and the manifests that name them, kept to one name each.
#   deploy/images.sh build IMAGE [EXTRAS]   docker/podman build -f deploy/Dockerfile -t IMAGE
#   deploy/images.sh push IMAGE...          push them
#   deploy/images.sh check IMAGE IMAGE_TRAIN   every manifest image line is one of the two
#   deploy/images.sh set IMAGE IMAGE_TRAIN     write the two names into every manifest
# The Makefile's IMAGE / IMAGE_TRAIN (make image, image-train, image-push, images-check,
# images-set) call it: change IMAGE there (or on make's command line) and nowhere else.
# The serving image goes to deploy/ray_cluster.yaml and deploy/kuberay/rayservice.yaml, the
# training image (EXTRAS=train,rollout,trl) to deploy/kuberay/rayjob.yaml.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
SERVING=("$HERE/ray_cluster.yaml" "$HERE/kuberay/rayservice.yaml")
TRAINING=("$HERE/kuberay/rayjob.yaml")

engine() {
    local e
    for e in docker podman; do
        if command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1; then echo "$e"; return 0; fi
    done
    echo "skipped: no working docker or podman here (not installed, or its daemon does not" \
         "answer \`docker info\`); run the same make target where one works (deploy/images.sh $*)" >&2
    return 1
}

# the image names a manifest uses: lines `image: NAME` (YAML) in it
images_in() { sed -nE 's/^[[:space:]-]*image:[[:space:]]*"?([^"#[:space:]]+)"?.*$/\1/p' "$1"; }

cmd="${1:-}"; shift || true
case "$cmd" in
    build)
        image="${1:?IMAGE}"; extras="${2:-server,gpu}"
        tool="$(engine build "$image")" || exit 0
        exec "$tool" build -f "$ROOT/deploy/Dockerfile" --build-arg "EXTRAS=$extras" -t "$image" "$ROOT"
        ;;
    push)
        tool="$(engine push "$@")" || exit 0
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
        sed -n '2,10p' "${BASH_SOURCE[0]}" >&2
        exit 2
        ;;
esac
