#!/bin/bash
# packaging/build-image.sh DEB [SOURCE_DIGEST]: build colad's container image from the .deb.
#
# Builds packaging/kubernetes/Dockerfile with podman (or buildah) into the local image store, from a
# context holding only DEB. The base image must already be in local storage (`make image-base`); it is
# never pulled. CONTAINERS_CONF defaults to packaging/kubernetes/containers.conf. Build output goes to
# stderr; the one line on stdout is the image reference, localhost/colad:<the .deb's version>.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
deb=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
digest=${2:-unknown}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$top/packaging/kubernetes/containers.conf}
version=$(dpkg-deb --field "$deb" Version)
ref=localhost/colad:$version

context=$(mktemp -d "${TMPDIR:-/tmp}/colad-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
cp "$deb" "$context/"

args=(--pull=never --file "$top/packaging/kubernetes/Dockerfile" --tag "$ref"
	--label "io.github.colad.source-digest=$digest" --label "org.opencontainers.image.version=$version")
if command -v podman >/dev/null; then
	podman build "${args[@]}" "$context" >&2
elif command -v buildah >/dev/null; then
	buildah bud "${args[@]}" "$context" >&2
else
	echo "build-image.sh: neither podman nor buildah is installed" >&2
	exit 1
fi
echo "$ref"
