"""Model parts: Gemma-2-style layers (norm, attention, blocks, stacks with caches) and the byte<->token
index maths. The U-Net that puts them together around a boundary strategy is `learntok.unet`."""
