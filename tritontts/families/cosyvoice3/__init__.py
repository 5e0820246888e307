"""CosyVoice3 family (FunAudioLLM/Fun-CosyVoice3-0.5B-2512, 24 kHz): a Qwen2 talker producing
speech tokens, a flow-matching DiT turning tokens into mel, and CausalHiFT turning mel into
audio. Modules here load the released checkpoint layout from a path."""
