#!/usr/bin/env bash
# loadable_copy.sh CHECKPOINT DEST: a copy of a GROUP_UNTIL run's checkpoint that learntok loads. The patch leaves one
# draw with batch_centering=group_loo in the saved config, which learntok refuses; the copy gets batch_centering=mean,
# what the run trained with after the switch (evaluation never reads it). The weights are hard links where possible.
mkdir -p "$2" && { ln -f "$1"/*.safetensors "$2"/ 2>/dev/null || cp "$1"/*.safetensors "$2"/; }
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); d['config']['boundaries']['learned']['batch_centering'] = 'mean'; json.dump(d, open(sys.argv[2], 'w'))" "$1/state.json" "$2/state.json"
