#!/usr/bin/env bash
# segment_patched_run.sh RUN_DIR: the segmented sentence of a GROUP_UNTIL run's final checkpoint. The patch leaves
# one draw with batch_centering=group_loo in the saved config, which learntok refuses to load; the copy gets
# batch_centering=mean, what the run trained with after the switch (evaluation never reads it).
ckpt=$(ls -d "$1"/step_* | tail -n 1); tmp=$(mktemp -d); mkdir "$tmp/ckpt"; cp "$ckpt"/*.safetensors "$tmp/ckpt/"
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); d['config']['boundaries']['learned']['batch_centering'] = 'mean'; json.dump(d, open(sys.argv[2], 'w'))" "$ckpt/state.json" "$tmp/ckpt/state.json"
learntok segment "$tmp/ckpt" "We will succeed in Iraq because Iraqis are determined to fight for their own freedom," | head -n 1
rm -r "$tmp"
