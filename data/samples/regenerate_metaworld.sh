#!/usr/bin/env bash
# Record the Meta-World ML1 datasets (pipeline/benchmarks/metaworld_record.py) in a throwaway
# virtualenv outside the repository: Meta-World is never an offmeta dependency. The recorder
# needs only metaworld, numpy, pyarrow and pydantic, and runs with this repository on
# PYTHONPATH. Recording is deterministic: the same arguments write the same bytes.
#
#   data/samples/regenerate_metaworld.sh              # the committed samples (seconds)
#   data/samples/regenerate_metaworld.sh --full DIR   # the full sets bench/metaworld.py trains
#                                                     # on: DIR/reach, DIR/push (minutes)
#   data/samples/regenerate_metaworld.sh --full DIR reach   # one skill (or several) only
#   data/samples/regenerate_metaworld.sh --full DIR pick-place   # pick-place (not a default)
#   data/samples/regenerate_metaworld.sh --full-published DIR [SKILL...]
#                                                     # recording (b), the published protocol
#   OFFMETA_METAWORLD_VENV=/some/dir data/samples/regenerate_metaworld.sh
#
# Samples: 6 train and 2 held-out goals, 4 episodes of 50 steps per goal (one per behaviour),
# of reach, push and pick-place (data/samples/metaworld_pick_place: the skill's hyphen becomes
# an underscore, as in the configs' names).
# Full sets: ML1's protocol in size as offmeta benchmarks it: 40 train and 10 held-out goals,
# 12 episodes of 500 steps per goal (3 per behaviour), 240,000 + 60,000 rows per skill.
# Recording (a) in docs/metaworld.md. --full-published: recording (b), the published offline
# ML1 protocol (IDAQ's): the scripted expert at action noise N(0, 0.1) only, no random policy,
# 45 episodes of 500 steps per goal, the same 40 train and 10 held-out goals; 900,000 +
# 225,000 rows per skill.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${OFFMETA_METAWORLD_VENV:-${TMPDIR:-/tmp}/offmeta-metaworld}"
metaworld_version="3.1.1" # pins mujoco 3.3.0; `import metaworld` needs packaging, undeclared

if [[ ! -x "$venv/bin/python" ]]; then
  python3.11 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet "metaworld==$metaworld_version" packaging numpy pyarrow \
  "pydantic>=2.7,<3"

record() {
  PYTHONPATH="$repo" "$venv/bin/python" -W ignore -m pipeline.benchmarks.metaworld_record "$@"
}

# The recorder's arguments of each full recording (its defaults: recording (a)).
case "${1:-}" in
  --full) protocol=() ;;
  --full-published) protocol=(--noise 0.1 --no-random --episodes-per-goal 45) ;;
esac
if [[ "${1:-}" == "--full" || "${1:-}" == "--full-published" ]]; then
  out="${2:?$1 needs a folder}"
  shift 2
  skills=("$@")
  if [[ ${#skills[@]} -eq 0 ]]; then
    skills=(reach push)
  fi
  for skill in "${skills[@]}"; do
    rm -rf "$out/$skill/train" "$out/$skill/heldout"
    record --env "$skill-v3" --out "$out/$skill" ${protocol[@]+"${protocol[@]}"}
  done
  exit 0
fi

for skill in reach push pick-place; do
  sample="$here/metaworld_${skill//-/_}"
  rm -rf "$sample/train" "$sample/heldout"
  record --env "$skill-v3" --out "$sample" --train-goals 6 --heldout-goals 2 \
    --episodes-per-goal 4 --max-steps 50
done
du -sh "$here"/metaworld_*
