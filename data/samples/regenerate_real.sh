#!/usr/bin/env bash
# Record the real-tool samples (RLlib's offline recorder, Minari's DataCollector) that
# tests/pipeline/importers/test_importers.py imports. RLlib and Minari are never offmeta dependencies: they are
# installed here, in a throwaway virtualenv outside the repository.
#
#   data/samples/regenerate_real.sh            # venv in ${TMPDIR:-/tmp}/offmeta-real-tools
#   OFFMETA_REAL_TOOLS_VENV=/some/dir data/samples/regenerate_real.sh
#
# Recordings are not byte-for-byte reproducible (RLlib names files and episodes with random
# ids; Minari measures ref_min_score from unseeded rollouts), though seeded training and
# collection give the same row and episode counts: the committed samples are one run.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${OFFMETA_REAL_TOOLS_VENV:-${TMPDIR:-/tmp}/offmeta-real-tools}"
ray_version="2.60.0"   # the Ray that offmeta itself uses (pyproject.toml)
minari_version="0.5.4" # writes arrow, parquet (>= 0.5.3) and hdf5 (with h5py)

if [[ ! -x "$venv/bin/python" ]]; then
  python3.11 -m venv "$venv"
fi
# torch pinned to the CPU build: an unpinned torch pulls a multi-GB CUDA build. Minari's
# arrow storage imports PIL without declaring it, and its DataCollector needs jax ("create").
"$venv/bin/pip" install --quiet "torch==2.13.0" "ray[rllib]==$ray_version" \
  "minari[arrow,create,hdf5]==$minari_version" "gymnasium" "pillow"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" "$here/record_real.py" --work "$work" --out "$here"
