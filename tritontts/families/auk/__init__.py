"""AuK / AuK-Flash (Tencent Hunyuan): Qwen2.5-Omni thinker condition -> rectified-flow MMDiT -> BigVGAN-flow VAE, 24 kHz."""
