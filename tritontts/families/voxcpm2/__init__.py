"""VoxCPM2: MiniCPM4 talker with a per-step local DiT -> causal AudioVAE v2, 48 kHz."""
