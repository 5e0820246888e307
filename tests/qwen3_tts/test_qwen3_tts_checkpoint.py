"""Qwen3-TTS checkpoint layout: our random checkpoints open, the reference (qwen-tts-compat)
parses their config.json and loads their safetensors with no missing or unexpected key;
broken files and fields are CheckpointErrors naming them; the request parser's 400s."""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.qwen3_tts.checkpoint import KINDS, open_checkpoint, parse_config
from tritontts.families.qwen3_tts.prompt import TextTokenizer
from tritontts.families.qwen3_tts.random_checkpoint import _config, write_random_checkpoint
from tritontts.families.qwen3_tts.request import check_task, parse_qwen3_tts_params
from tritontts.families.qwen3_tts.talker import Qwen3TTSTalker, load_talker
from tritontts.protocol import InvalidRequest
from tritontts.families.qwen3_tts.upstream import qwen_tts_module


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    return {kind: write_random_checkpoint(tmp_path_factory.mktemp(f"qwen3-{kind}"), kind)
            for kind in KINDS}


def test_each_kind_opens(checkpoints):
    for kind, root in checkpoints.items():
        ckpt = open_checkpoint(root)
        assert ckpt.kind == kind and ckpt.config.model_size == "1b7"   # tiny is 1.7B-shaped
        talker = ckpt.config.talker
        print(kind, "speakers", ckpt.speakers, "languages", ckpt.languages,
              "text vocab", talker.text_vocab_size, "special", ckpt.config.im_start_token_id,
              ckpt.config.tts_pad_token_id)
        assert ckpt.languages[0] == "auto" and "english" in ckpt.languages
        assert not any("dialect" in name for name in ckpt.languages)
        assert ckpt.language_id("English") == 2050 and ckpt.language_id("AUTO") is None
        assert (talker.hidden_size, talker.head_dim, talker.code_predictor.hidden_size) == (128, 64, 64)
        if kind == "custom_voice":
            assert len(ckpt.speakers) == 9
            assert ckpt.speaker_id("VIVIAN") == ckpt.speaker_id("vivian") == 3065
            assert ckpt.speaker_dialect("Eric") == "sichuan_dialect" and ckpt.speaker_dialect("ryan") is None
        else:
            assert ckpt.speakers == () and ckpt.speaker_id("vivian") is None
        assert any(n.startswith("speaker_encoder.") for n in ckpt.weight_names) == (kind == "base")
        # The tokenizer agrees with config.json's special ids, and the chat template splits
        # into the token counts the reference slices by.
        tok = TextTokenizer(ckpt)
        ids = tok.assistant_ids("Hello there.")
        assert ids[0] == ckpt.config.im_start_token_id and ids[-5] == ckpt.config.im_end_token_id
        assert len(tok.encode("<|im_start|>assistant\n")) == 3 and len(tok.encode("<|im_end|>\n")) == 2


def test_reference_parses_config_and_loads_the_weights(checkpoints):
    with qwen_tts_module("qwen_tts.core.models.modeling_qwen3_tts") as ref:
        for kind, root in checkpoints.items():
            config = ref.Qwen3TTSConfig.from_pretrained(str(root))
            ours = open_checkpoint(root).config
            assert config.tts_model_type == kind
            t = config.talker_config
            assert (t.hidden_size, t.vocab_size, t.text_vocab_size, t.codec_bos_id, t.codec_eos_token_id) == (
                ours.talker.hidden_size, ours.talker.vocab_size, ours.talker.text_vocab_size,
                ours.talker.codec_bos_id, ours.talker.codec_eos_token_id)
            assert config.tts_pad_token_id == ours.tts_pad_token_id
            model = ref.Qwen3TTSForConditionalGeneration(config)
            state = load_file(str(root / "model.safetensors"))
            result = model.load_state_dict(state, strict=False)
            print(kind, len(state), "tensors; missing", result.missing_keys, "unexpected", result.unexpected_keys)
            assert result.missing_keys == [] and result.unexpected_keys == []
            # Negative control: a dropped tensor is reported.
            state.pop("talker.code_predictor.lm_head.3.weight")
            assert model.load_state_dict(state, strict=False).missing_keys == ["talker.code_predictor.lm_head.3.weight"]
    with qwen_tts_module("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2") as ref:
        directory = checkpoints["base"] / "speech_tokenizer"
        model = ref.Qwen3TTSTokenizerV2Model(ref.Qwen3TTSTokenizerV2Config.from_pretrained(str(directory)))
        result = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
        print("speech_tokenizer missing", result.missing_keys, "unexpected", result.unexpected_keys)
        assert result.missing_keys == [] and result.unexpected_keys == []


def test_predictor_projection_only_where_widths_differ(checkpoints):
    """0.6B's predictor is as wide as its talker (no small_to_mtp_projection), 1.7B's is
    narrower (tiny is like 1.7B): our module has the reference's keys either way."""
    special = {token: i for i, token in enumerate(["<|im_start|>", "<|im_end|>", "<tts_pad>",
                                                   "<tts_text_bos>", "<tts_text_eod>", "assistant"])}
    with qwen_tts_module("qwen_tts.core.models.modeling_qwen3_tts") as ref:
        for width in (64, 128):
            raw = _config("custom_voice", "tiny", special)
            raw["talker_config"]["code_predictor_config"]["hidden_size"] = width
            theirs = ref.Qwen3TTSForConditionalGeneration(ref.Qwen3TTSConfig(**json.loads(json.dumps(raw))))
            ours = Qwen3TTSTalker(parse_config(raw, Path("config.json")))
            shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
            assert shapes == {k[len("talker."):]: tuple(v.shape) for k, v in theirs.state_dict().items()}
            has = any("small_to_mtp_projection" in k for k in shapes)
            print("predictor width", width, "projection", has)
            assert has == (width != 128)


def _copy(root: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(root, target)
    return target


def _edit_config(root: Path, edit) -> None:
    data = json.loads((root / "config.json").read_text())
    edit(data)
    (root / "config.json").write_text(json.dumps(data))


@pytest.mark.parametrize("case, expected", [
    ("missing_file", "speech_tokenizer/preprocessor_config.json: missing"),
    ("missing_tokenizer", "needs tokenizer.json or vocab.json + merges.txt"),
    ("bad_json", "config.json: not readable JSON"),
    ("missing_field", "talker_config.codec_pad_id is missing"),
    ("bad_type", "talker_config.code_predictor_config.hidden_size must be an integer"),
    ("bad_kind", "tts_model_type is 'clone'"),
    ("bad_rope", "talker_config.rope_scaling.mrope_section [24, 20, 20] must be non-negative and add up to head_dim / 2 = 32"),
    ("bad_speaker", "talker_config.spk_id.vivian must be a codec id in [0, 3072)"),
    ("bad_generation", "generation_config.json: top_p must be in (0, 1]"),
    ("bad_weights", "model.safetensors: not a readable safetensors file"),
    ("no_talker_weights", "model.safetensors: no talker.* tensors"),
])
def test_broken_checkpoints_name_the_file_and_field(checkpoints, tmp_path, case, expected):
    root = _copy(checkpoints["custom_voice"], tmp_path)
    open_checkpoint(root)       # positive control: the untouched copy opens
    if case == "missing_file":
        (root / "speech_tokenizer" / "preprocessor_config.json").unlink()
    elif case == "missing_tokenizer":
        (root / "merges.txt").unlink()
    elif case == "bad_json":
        (root / "config.json").write_text("{not json")
    elif case == "missing_field":
        _edit_config(root, lambda d: d["talker_config"].pop("codec_pad_id"))
    elif case == "bad_type":
        _edit_config(root, lambda d: d["talker_config"]["code_predictor_config"].update(hidden_size="64"))
    elif case == "bad_kind":
        _edit_config(root, lambda d: d.update(tts_model_type="clone"))
    elif case == "bad_rope":
        _edit_config(root, lambda d: d["talker_config"]["rope_scaling"].update(mrope_section=[24, 20, 20]))
    elif case == "bad_speaker":
        _edit_config(root, lambda d: d["talker_config"]["spk_id"].update(vivian=5000))
    elif case == "bad_generation":
        (root / "generation_config.json").write_text(json.dumps({"top_p": 2.0}))
    elif case == "bad_weights":
        (root / "model.safetensors").write_bytes(b"\x00" * 64)
    elif case == "no_talker_weights":
        save_file({"other.weight": torch.zeros(2)}, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        open_checkpoint(root)
    print(case, "->", err.value)
    assert expected in str(err.value)


def test_missing_or_misshapen_talker_tensor_is_named(checkpoints, tmp_path):
    root = _copy(checkpoints["custom_voice"], tmp_path)
    assert load_talker(open_checkpoint(root)) is not None      # positive control
    state = load_file(str(root / "model.safetensors"))
    state.pop("talker.model.layers.1.self_attn.k_norm.weight")
    state["talker.codec_head.weight"] = state["talker.codec_head.weight"][:-1]
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_talker(open_checkpoint(root))
    print(err.value)
    assert "missing keys: model.layers.1.self_attn.k_norm.weight" in str(err.value)
    assert "codec_head.weight (3071, 128) vs (3072, 128)" in str(err.value)


# --- request parameters -------------------------------------------------------------------

AUDIO = base64.b64encode(b"RIFF....WAVEfmt ").decode()


def _bad(params: dict, expected: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_qwen3_tts_params(params)
    print(params if len(str(params)) < 80 else list(params), "->", err.value)
    assert expected in str(err.value)


def test_request_parser_accepts_the_vllm_omni_fields():
    p = parse_qwen3_tts_params({})
    assert (p.task_type, p.language, p.instructions, p.max_new_tokens) == (None, "Auto", None, None)
    p = parse_qwen3_tts_params({"task_type": "CustomVoice", "instructions": " Speak slowly. ",
                                "language": "English", "max_new_tokens": 8192, "seed": 7,
                                "initial_codec_chunk_frames": 25})
    assert (p.instructions, p.seed, p.initial_codec_chunk_frames) == ("Speak slowly.", 7, 25)
    # A voice reference implies Base; a data: URL is accepted like plain base64.
    p = parse_qwen3_tts_params({"ref_audio": "data:audio/wav;base64," + AUDIO, "ref_text": "Hi."})
    assert (p.task_type, p.ref_audio[:4], p.in_context) == ("Base", b"RIFF", True)
    p = parse_qwen3_tts_params({"ref_audio": AUDIO, "x_vector_only_mode": True})
    assert not p.in_context
    p = parse_qwen3_tts_params({"speaker_embedding": [0.5, -1, 2]})
    assert (p.task_type, p.speaker_embedding, p.x_vector_only_mode) == ("Base", (0.5, -1.0, 2.0), True)


def test_request_parser_rejects_with_a_reason():
    _bad({"voice_id": "x"}, "unknown parameter(s) ['voice_id']")
    _bad({"task_type": "Clone"}, "task_type must be one of ['CustomVoice', 'VoiceDesign', 'Base']")
    _bad({"max_new_tokens": "5"}, "max_new_tokens must be an integer from 1 to 8192")
    _bad({"max_new_tokens": 8193}, "max_new_tokens must be an integer from 1 to 8192")
    _bad({"max_new_tokens": True}, "max_new_tokens must be an integer")
    _bad({"initial_codec_chunk_frames": 0}, "initial_codec_chunk_frames must be an integer from 1 to 25")
    _bad({"seed": -1}, "seed must be a non-negative integer")
    _bad({"language": 5}, "language must be a string")
    _bad({"instructions": ["a"]}, "instructions must be a string")
    _bad({"ref_audio": AUDIO, "x_vector_only_mode": "yes"}, "x_vector_only_mode must be true or false")
    _bad({"ref_audio": "not base64!", "ref_text": "Hi."}, "ref_audio must be base64-encoded audio")
    _bad({"speaker_embedding": [1.0, float("nan")]}, "speaker_embedding values must be finite")
    _bad({"speaker_embedding": []}, "speaker_embedding must be a non-empty list")
    _bad({"speaker_embedding": ["1"]}, "speaker_embedding must be a non-empty list")
    _bad({"task_type": "CustomVoice", "ref_text": "Hi."}, "ref_text is only valid for task_type Base")
    _bad({"task_type": "VoiceDesign"}, "VoiceDesign needs instructions")
    _bad({"task_type": "Base"}, "give ref_audio (base64 audio) or speaker_embedding")
    _bad({"ref_audio": AUDIO}, "Base in-context cloning needs ref_text")
    _bad({"ref_audio": AUDIO, "speaker_embedding": [1.0]}, "mutually exclusive")
    _bad({"speaker_embedding": [1.0], "x_vector_only_mode": False}, "clones from the embedding alone")
    _bad({"ref_audio": AUDIO, "ref_text": "Hi.", "instructions": "slowly"}, "not used by Base")


def test_task_and_checkpoint_kind_must_match():
    custom = parse_qwen3_tts_params({"instructions": "Speak slowly."})
    assert check_task(custom, "custom_voice") == "CustomVoice"      # positive control
    assert check_task(custom, "voice_design") == "VoiceDesign"      # the checkpoint's own task
    clone = parse_qwen3_tts_params({"speaker_embedding": [0.0] * 128})
    assert check_task(clone, "base", speaker_embedding_dim=128) == "Base"
    for params, kind, expected in (
            (clone, "custom_voice", "task_type Base needs a base checkpoint (Qwen3-TTS-12Hz-{0.6B,1.7B}-Base); "
                                    "the loaded checkpoint is custom_voice"),
            (parse_qwen3_tts_params({"task_type": "VoiceDesign", "instructions": "a deep voice"}), "base",
             "task_type VoiceDesign needs a voice_design checkpoint (Qwen3-TTS-12Hz-1.7B-VoiceDesign)"),
            (parse_qwen3_tts_params({"task_type": "CustomVoice"}), "voice_design",
             "task_type CustomVoice needs a custom_voice checkpoint"),
            (parse_qwen3_tts_params({}), "voice_design", "VoiceDesign needs instructions")):
        with pytest.raises(InvalidRequest) as err:
            check_task(params, kind)
        print(kind, "->", err.value)
        assert expected in str(err.value)
    with pytest.raises(InvalidRequest, match="this checkpoint takes 1024"):
        check_task(clone, "base", speaker_embedding_dim=1024)
    with pytest.raises(InvalidRequest, match="language 'Klingon' is not one of"):
        check_task(parse_qwen3_tts_params({"language": "Klingon"}), "custom_voice", languages=("auto", "english"))
    assert check_task(parse_qwen3_tts_params({"language": "ENGLISH"}), "custom_voice",
                      languages=("auto", "english")) == "CustomVoice"
    with pytest.raises(InvalidRequest, match="0.6B CustomVoice checkpoint does not follow instructions"):
        check_task(custom, "custom_voice", model_size="0b6")
    assert check_task(custom, "custom_voice", model_size="1b7") == "CustomVoice"
