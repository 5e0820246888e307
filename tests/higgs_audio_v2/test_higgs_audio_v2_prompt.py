"""The higgs-audio v2 prompt against transformers' HiggsAudioV2Processor on the tiny random
checkpoint: the token ids (placeholders expanded for the reference) and the reference's
codes in the delay pattern are equal, for plain text and for cloning. The processor is fed
the chat template's rendering of the two conversations (system, [reference transcript,
reference audio,] text, generation prompt); the template itself is Jinja in the released
tokenizer_config and is not executed here. Plus the delay pattern's own round trip and the
request parser's 400s."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf
import torch

from tritontts.family import synthetic_reference
from tritontts.families.higgs_audio_v2.prompt import apply_delay, reference_steps, undo_delay
from tritontts.families.higgs_audio_v2.request import parse_higgs_audio_v2_params
from tritontts.protocol import InvalidRequest

TEXT = "The birch canoe slid on the smooth planks."
REF = synthetic_reference()
HEADER = "<|start_header_id|>{}<|end_header_id|>\n\n"
SYSTEM = "<|begin_of_text|>" + HEADER.format("system") + "Generate audio following instruction.<|eot_id|>"
GENERATION = HEADER.format("assistant") + "<|audio_out_bos|>"


@pytest.fixture(scope="module")
def prompt_stage(checkpoint):
    from tritontts.families.higgs_audio_v2.stages import HiggsAudioV2PromptStage
    from tritontts.serving.stage import StageContext

    return HiggsAudioV2PromptStage(StageContext("higgs_audio_v2_prompt", checkpoint.root), checkpoint)


@pytest.fixture(scope="module")
def processor(checkpoint):
    from transformers import DacFeatureExtractor, HiggsAudioV2Processor, PreTrainedTokenizerFast

    from tritontts.nn.higgs_codec.encoder import _tokenizer_classes

    # transformers' own HiggsAudioV2TokenizerModel, imported with our torchaudio stand-in
    # (torchaudio is absent here; tests/test_higgs_codec.py checks the stand-in). The
    # processor's class check resolves the name through transformers' top level, which
    # without torchaudio is a placeholder, so that check alone is skipped.
    codec_class, _ = _tokenizer_classes()
    check = HiggsAudioV2Processor.check_argument_for_proper_class
    HiggsAudioV2Processor.check_argument_for_proper_class = lambda self, name, value: None
    try:
        return HiggsAudioV2Processor(
            feature_extractor=DacFeatureExtractor(feature_size=1, hop_length=1, padding_side="right",
                                                  padding_value=0.0, sampling_rate=24000,
                                                  return_attention_mask=True),
            tokenizer=PreTrainedTokenizerFast.from_pretrained(str(checkpoint.root)),
            audio_tokenizer=codec_class.from_pretrained(str(checkpoint.codec_dir), local_files_only=True).eval())
    finally:
        HiggsAudioV2Processor.check_argument_for_proper_class = check


def test_plain_text_prompt_ids_equal_the_reference_processor(prompt_stage, processor):
    ids, steps = prompt_stage.prompt(TEXT, parse_higgs_audio_v2_params({}))
    rendered = SYSTEM + HEADER.format("user") + TEXT + "<|eot_id|>" + GENERATION
    want = processor(text=rendered, return_tensors="pt")["input_ids"][0].tolist()
    assert ids == want and steps.shape[0] == 0


def test_cloning_prompt_ids_and_reference_steps_equal_the_reference_processor(prompt_stage, processor):
    ids, steps = prompt_stage.prompt(TEXT, parse_higgs_audio_v2_params(REF))
    audio, rate = sf.read(io.BytesIO(base64.b64decode(REF["ref_audio"])), dtype="float32")
    assert rate == 24000
    rendered = (SYSTEM + HEADER.format("user") + REF["ref_text"] + "<|eot_id|>" + HEADER.format("assistant")
                + "<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|><|eot_id|>"
                + HEADER.format("user") + TEXT + "<|eot_id|>" + GENERATION)
    with torch.no_grad():
        out = processor(text=rendered, audio=[audio], return_tensors="pt")
    print(f"prompt {len(ids)} ids, reference {steps.shape[0]} steps")
    assert ids == out["input_ids"][0].tolist()
    assert np.array_equal(steps, out["audio_input_ids"][0].numpy())
    assert steps.shape[0] == 75 + 2 + 7          # 3 s at 25 frames/s, bos and eos, the delay


def test_control_a_shifted_reference_is_not_the_processors(processor):
    codes = np.random.default_rng(1).integers(0, 1024, (10, 8))
    ours = reference_steps(codes, 1024, 1025)
    theirs = processor.build_delay_pattern(torch.from_numpy(
        np.concatenate([np.full((8, 1), 1024), codes.T, np.full((8, 1), 1025)], axis=1))[None])[0].T.numpy()
    assert np.array_equal(ours, theirs)
    assert not np.array_equal(reference_steps(np.roll(codes, 1, axis=0), 1024, 1025), theirs)


def test_the_delay_pattern_round_trips_and_shifts_codebook_k_by_k():
    codes = np.arange(40).reshape(5, 8)
    delayed = apply_delay(codes, -1, -2)
    assert delayed.shape == (12, 8)
    assert delayed[3, 3] == codes[0, 3] and delayed[2, 3] == -1 and delayed[8, 3] == -2
    assert np.array_equal(undo_delay(delayed), codes)


@pytest.mark.parametrize("params,needle", [
    ({"instructions": "whisper"}, "instructions"),
    ({"task_type": "Base"}, "task_type"),
    ({"language": "fr"}, "language"),
    ({"speed": 0.5}, "speed"),
    ({"ref_audio": REF["ref_audio"]}, "ref_text"),
    ({"ref_text": "x"}, "ref_audio"),
    ({"ref_text": "[SPEAKER1] x", "ref_audio": REF["ref_audio"]}, "SPEAKER1"),
    ({"max_new_tokens": 5000}, "max_new_tokens"),
    ({"initial_codec_chunk_frames": 26}, "initial_codec_chunk_frames"),
    ({"top_k": -1}, "top_k"),
    ({"num_steps": 8}, "unknown parameter"),
])
def test_bad_params_are_invalid_requests_naming_the_field(params, needle):
    with pytest.raises(InvalidRequest, match=needle):
        parse_higgs_audio_v2_params(params)


def test_speed_1_and_language_auto_are_accepted():
    p = parse_higgs_audio_v2_params({"speed": 1.0, "language": "auto", "seed": 4, "temperature": 0.0})
    assert p.seed == 4 and p.sampling == {"temperature": 0.0}
