#!/usr/bin/env bash
# segment_patched_run.sh RUN_DIR: the segmented sentence of a GROUP_UNTIL run's final checkpoint, through a copy
# that learntok loads (loadable_copy.sh).
ckpt=$(ls -d "$1"/step_* | tail -n 1); tmp=$(mktemp -d)
"$(dirname "$0")/loadable_copy.sh" "$ckpt" "$tmp/ckpt"
learntok segment "$tmp/ckpt" "We will succeed in Iraq because Iraqis are determined to fight for their own freedom," | head -n 1
rm -r "$tmp"
