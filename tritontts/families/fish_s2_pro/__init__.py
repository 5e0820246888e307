"""Fish Speech S2 Pro (fish_qwen3_omni): dual-AR talker and the modded causal DAC codec."""
