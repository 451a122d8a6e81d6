#!/bin/bash
# packaging/build-deb.sh [OUTDIR]: build the colad .deb from a clean copy of this tree.
#
# Copies the files git knows (tracked, plus untracked ones that are not
# ignored, so uncommitted work is included but never .venv, build/ or
# *.egg-info) to a temporary directory, puts packaging/debian there as debian/,
# and runs dpkg-buildpackage (dh + pybuild). The checkout itself is never
# written to. Build output goes to stderr; the one line on stdout is the path
# of the .deb, copied to OUTDIR (default: dist/ of this tree).
set -euo pipefail

top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=${1:-$top/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/colad-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"

# Files deleted from the work tree but still in the index are left out.
git -C "$top" ls-files -z --cached --others --exclude-standard --deduplicate \
	| (cd "$top" && while IFS= read -r -d '' f; do
		if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
	done) \
	| (cd "$top" && tar --null --no-recursion -T - -cf -) \
	| tar -xf - -C "$work/src"
rm -rf "$work/src/debian"  # a stray debian/ in the checkout must not mix with ours
cp -a "$work/src/packaging/debian" "$work/src/debian"

# pybuild must find Debian's python3 and its modules, never a venv or pyenv
# shim that happens to be first on PATH (it then fails with "No module named build").
(cd "$work/src" && env -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME -u PYTHONDONTWRITEBYTECODE \
	PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b) >&2

debs=("$work"/colad_*_all.deb)
if [ ! -f "${debs[0]}" ]; then
	echo "build-deb.sh: dpkg-buildpackage made no colad_*_all.deb" >&2
	exit 1
fi
cp "${debs[0]}" "$out/"
echo "$out/$(basename "${debs[0]}")"
