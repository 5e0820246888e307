"""OmniVoice: bidirectional iterative-unmasking TTS (k2-fsa) served as Triton stages."""
