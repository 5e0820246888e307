"""The Voxtral TTS talker on vLLM (tritontts.families.voxtral_tts.vllm_model: vLLM's Llama on the
Mistral-format weights, the acoustic transformer in compute_logits) against our PyTorch
talker on the same tiny checkpoint, fp32, the same per-request noise: the frames of three
requests generated together (two voices, other seeds and cfg) equal the one-request loop,
and each request ends where its END_AUDIO frame comes (or at its frame budget)."""
from __future__ import annotations

import gc

import pytest
import torch

from tritontts.testing.engine import close_engine, frames_engine
from tritontts.families.voxtral_tts.checkpoint import open_checkpoint
from tritontts.families.voxtral_tts.random_checkpoint import write_random_checkpoint
from tritontts.families.voxtral_tts.talker import VoxtralTalker, talker_state

MAX_FRAMES = 12
REQUESTS = [("Hello there, how are you today?", "casual_male", 1, 1.2),
            ("One more.", "neutral_female", 2, 1.2),
            ("A third request with longer text.", "casual_male", 3, 1.5)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tritontts.families.voxtral_tts.vllm_model import prepare_vllm_talker, register

    checkpoint = open_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("voxtral") / "tiny", seed=4))
    register()
    llm = frames_engine(prepare_vllm_talker(checkpoint, tmp_path_factory.mktemp("cache")), 64 * 2**20)
    yield checkpoint, llm
    close_engine(llm)
    del llm
    gc.collect()


def speech_ids(checkpoint, text, voice):
    from mistral_common.protocol.speech.request import SpeechRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_file(str(checkpoint.path("tekken.json")))
    return torch.tensor(tokenizer.instruct_tokenizer.encode_speech_request(SpeechRequest(input=text, voice=voice)).tokens)


def test_vllm_frames_equal_the_pytorch_talker_for_batched_requests(engine):
    from safetensors.torch import load_file
    from vllm import SamplingParams, TokensPrompt

    from tritontts.engine.vllm_frames import FRAMES_ARG, register, release
    from tritontts.families.voxtral_tts.vllm_model import EOS, VoiceStream

    checkpoint, llm = engine
    talker = VoxtralTalker(checkpoint.config)
    talker.load_state_dict(talker_state(load_file(str(checkpoint.path("consolidated.safetensors")))))
    talker.eval()
    expected, inputs, params, keys = [], [], [], []
    for k, (text, voice, seed, cfg) in enumerate(REQUESTS):
        ids, rows = speech_ids(checkpoint, text, voice), checkpoint.voice_embedding(voice)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            expected.append(talker.generate(talker.prompt_embeds(ids, rows),
                                            lambda: torch.randn(1, 36, generator=gen), MAX_FRAMES, cfg))
        key = f"req-{k}"
        register(key, VoiceStream(ids, rows, torch.Generator().manual_seed(seed), cfg))
        inputs.append(TokensPrompt(prompt_token_ids=ids.tolist()))
        params.append(SamplingParams(temperature=0.0, max_tokens=MAX_FRAMES + 1, stop_token_ids=[EOS],
                                     detokenize=False, extra_args={FRAMES_ARG: key}))
        keys.append(key)
    outputs = llm.generate(inputs, params, use_tqdm=False)
    for k, (want, output, key) in enumerate(zip(expected, outputs, keys)):
        frames = release(key).frames
        got = torch.stack([f for f in frames if int(f[0]) != 1]) if frames else torch.zeros(0, 37)
        got = got[:MAX_FRAMES]
        print(f"request {k}: {got.shape[0]} frames from vLLM, {want.shape[0]} expected; "
              f"tokens {list(output.outputs[0].token_ids)}")
        assert got.shape == want.shape and torch.equal(got, want)
