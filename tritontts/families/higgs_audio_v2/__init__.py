"""higgs-audio v2 (boson-ai): a Llama-3.2-3B talker with DualFFN emitting 8 delayed codebooks per step, and the higgs-audio v2 codec."""
