"""GLM-TTS: Llama speech-token talker -> flow-matching DiT -> HiFT vocoder."""
