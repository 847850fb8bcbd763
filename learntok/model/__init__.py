"""Model: Gemma-2-style layers, byte<->token index maths, the autoregressive U-Net."""
