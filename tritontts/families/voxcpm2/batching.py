"""VoxCPM2's batched stage at streaming shapes (tritontts.benchmark.batching): the AudioVAE
decoding a steady chunk of the talker's schedule (model_repository/voxcpm2_talker/1/
model.json: 16 patches) after the decoder's receptive field as left context, in whole
patches as the talker sends it."""
from __future__ import annotations

import numpy as np

from ...family import BatchCase
from ...serving.stage import Inputs
from .audio_vae import AudioVAEConfig, decoder_context_frames
from .stages import VoxCPM2AudioVAEStage

PATCHES = 16


def batch_cases(checkpoint) -> list[BatchCase]:
    vae = AudioVAEConfig.from_dict(checkpoint.config.audio_vae or {})
    p = checkpoint.config.patch_size
    new, context = PATCHES * p, -(-decoder_context_frames(vae) // p) * p

    def request(k: int) -> Inputs:
        rng = np.random.default_rng(k)
        return Inputs(latents=rng.standard_normal((context + new, vae.latent_dim)).astype(np.float32),
                      left_context=np.array([context]))

    return [BatchCase("voxcpm2_audio_vae", lambda ctx: VoxCPM2AudioVAEStage(ctx, checkpoint), request,
                      new * vae.decode_hop / vae.out_sample_rate,
                      f"{PATCHES} patches ({new} frames) after {context} of left context")]
