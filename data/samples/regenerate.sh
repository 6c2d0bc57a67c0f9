#!/usr/bin/env bash
# Rebuild the committed sample datasets. Generation is deterministic, so running this on an
# unchanged generator rewrites the same bytes (and the same fingerprints).
set -euo pipefail
cd "$(dirname "$0")"
OFFMETA="${OFFMETA:-../../.venv/bin/offmeta}"
rm -rf sinusoid/train sinusoid/heldout point_robot/train point_robot/heldout \
    point_robot_mixed/train point_robot_mixed/heldout \
    point_robot_pixels/train point_robot_pixels/heldout
"$OFFMETA" data generate sinusoid --tasks 4000 --heldout-tasks 200 --seed 0 --out sinusoid
"$OFFMETA" data generate point_robot --tasks 200 --heldout-tasks 50 --episodes-per-task 5 \
    --seed 0 --out point_robot
"$OFFMETA" data generate point_robot --tasks 150 --heldout-tasks 40 --episodes-per-task 4 \
    --behavior mixed --random-share 0.5 --seed 0 --out point_robot_mixed
"$OFFMETA" data generate point_robot_pixels --tasks 60 --heldout-tasks 20 \
    --episodes-per-task 2 --image-size 32 --new-obs no --seed 0 --out point_robot_pixels
du -sh .
