"""The preset speakers' vectors of a Qwen3-TTS checkpoint (Family.speaker_embeddings): a
CustomVoice preset is spoken from its row of the talker's codec table (spk_id names the
row), the same place in the prompt where Base puts an x-vector. tritontts-voice blend mixes
these rows (and stored voices' vectors) into a new voice."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .checkpoint import TALKER_PREFIX, open_checkpoint

CODEC_TABLE = TALKER_PREFIX + "model.codec_embedding."


def preset_embeddings(path: Path) -> dict[str, np.ndarray]:
    """{speaker as spk_id spells it: its codec-table row as float32}, as the prompt stage's
    float32 talker holds it; {} for a checkpoint without presets (Base, VoiceDesign)."""
    checkpoint = open_checkpoint(path)
    speakers = checkpoint.config.talker.spk_id
    if not speakers:
        return {}
    table = checkpoint.tensors(CODEC_TABLE)["weight"].float().numpy()
    return {name: table[row].copy() for name, row in speakers.items()}
