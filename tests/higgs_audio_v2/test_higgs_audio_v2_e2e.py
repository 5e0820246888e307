"""higgs-audio v2 through the real tritonserver and front on a tiny random checkpoint: a
seeded stream equals the reference pipeline run in this process (transformers' generate
with the same seed and sampling, its processor's delay undoing, transformers' codec decode),
chunk after chunk, with the chunk plan the talker promises (a short first chunk, growing
ones, each after its codec context exists); cloning from ref_audio and from an uploaded
voice; concurrent requests share the decoder's batches; the 400s of what the model cannot do."""
from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tritontts.family import synthetic_reference
from tritontts.testing.audio import pcm16, rms
from tritontts.testing.grpc import stream_model

STACK_FAMILIES = ("higgs_audio_v2",)
TEXT = "The birch canoe slid on the smooth planks."
FRAMES = 60
REF = synthetic_reference()


def speak(http, **body):
    return http.post("/v1/audio/speech", json={"model": "higgs_audio_v2", "input": TEXT, "seed": 3,
                                               "max_new_tokens": FRAMES, "response_format": "pcm", **body})


def reference_audio(checkpoint_dir, text, seed, frames, ref_audio=None, ref_text=None):
    """The reference pipeline in this process: prompt as the prompt stage builds it (its
    own tests check it against the reference processor), transformers' generate with the
    checkpoint's sampling and this seed, the processor's delay undoing, transformers' codec."""
    from transformers import HiggsAudioV2ForConditionalGeneration, HiggsAudioV2Processor

    from tritontts.families.higgs_audio_v2.checkpoint import open_checkpoint
    from tritontts.families.higgs_audio_v2.request import parse_higgs_audio_v2_params
    from tritontts.families.higgs_audio_v2.stages import HiggsAudioV2PromptStage
    from tritontts.nn.higgs_codec.encoder import _tokenizer_classes
    from tritontts.serving.stage import StageContext

    ckpt = open_checkpoint(checkpoint_dir)
    g = ckpt.generation
    prompt = HiggsAudioV2PromptStage(StageContext("higgs_audio_v2_prompt", checkpoint_dir), ckpt)
    fields = {} if ref_audio is None else {"ref_audio": ref_audio, "ref_text": ref_text}
    ids, steps = prompt.prompt(text, parse_higgs_audio_v2_params(fields))
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(str(checkpoint_dir)).eval()
    model.generation_config.ras_win_len = g.ras_win_len
    model.generation_config.ras_win_max_num_repeat = g.ras_win_max_num_repeat
    extra = {}
    if steps.shape[0]:
        extra = dict(audio_input_ids=torch.from_numpy(steps)[None].long(),
                     audio_input_ids_mask=torch.ones(1, steps.shape[0], dtype=torch.bool))
    torch.manual_seed(seed)
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids_t, attention_mask=torch.ones_like(ids_t), do_sample=True,
                             temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                             max_new_tokens=frames + 8, **extra)[0][steps.shape[0]:]
    end = int((out == 1025).all(dim=1).nonzero()[0]) if bool((out == 1025).all(dim=1).any()) else out.shape[0]
    codes = HiggsAudioV2Processor.revert_delay_pattern(None, out[1:end]).clip(0, 1023)
    codec_class, _ = _tokenizer_classes()
    codec = codec_class.from_pretrained(str(ckpt.codec_dir), local_files_only=True).eval()
    with torch.no_grad():
        audio = codec.decode(codes.T[None]).audio_values.reshape(-1).numpy()
    return np.clip(audio, -1.0, 1.0), codes.shape[0]


def test_a_seeded_stream_equals_the_reference_pipeline_chunk_by_chunk(stack, random_checkpoints):
    chunks, error = stream_model(stack.grpc_url, "higgs_audio_v2", TEXT,
                                 params={"seed": 11, "max_new_tokens": FRAMES})
    assert error is None, error
    want, frames = reference_audio(random_checkpoints["higgs_audio_v2"], TEXT, 11, FRAMES)
    sizes = [c.as_numpy("audio").size // 960 for c in chunks]
    print(f"{frames} frames in chunks of {sizes}")
    assert sum(sizes) == frames and sizes[:3] == [5, 10, 20][:len(sizes[:3])]
    got = np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks])
    assert {int(c.as_numpy("sample_rate").reshape(-1)[0]) for c in chunks} == {24000}
    assert got.shape == want.shape and rms(got) > 1e-3
    diff = float(np.abs(got - want).max())
    print(f"served vs reference: max-abs-diff {diff:.2e} (peak {float(np.abs(want).max()):.3f})")
    assert diff <= 1e-4 * max(float(np.abs(want).max()), 1e-6)


def test_cloning_equals_the_reference_pipeline_and_the_uploaded_voice_speaks_the_same(stack, http, random_checkpoints):
    chunks, error = stream_model(stack.grpc_url, "higgs_audio_v2", TEXT,
                                 params={"seed": 12, "max_new_tokens": FRAMES, **REF})
    assert error is None, error
    got = np.concatenate([c.as_numpy("audio").reshape(-1) for c in chunks])
    want, _ = reference_audio(random_checkpoints["higgs_audio_v2"], TEXT, 12, FRAMES,
                              REF["ref_audio"], REF["ref_text"])
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-4 * max(float(np.abs(want).max()), 1e-6)
    direct = speak(http, **REF)
    assert direct.status_code == 200, direct.text
    assert direct.content != speak(http).content
    r = http.post("/v1/audio/voices", data={"name": "Reader", "consent": "test", "ref_text": REF["ref_text"]},
                  files={"audio_sample": ("ref.wav", base64.b64decode(REF["ref_audio"]), "audio/wav")})
    assert r.status_code == 200, r.text
    try:
        by_name = speak(http, voice="reader")
        assert by_name.status_code == 200, by_name.text
        assert by_name.content == direct.content
    finally:
        http.delete("/v1/audio/voices/Reader")


def test_temperature_zero_is_greedy_and_ignores_the_seed(http):
    a, b = speak(http, temperature=0.0, seed=1), speak(http, temperature=0.0, seed=2)
    assert a.status_code == b.status_code == 200, a.text
    assert a.content == b.content and a.content != speak(http, seed=1).content


def test_concurrent_requests_share_decoder_batches(stack, http):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(stack.grpc_url)

    def counts():
        stats = client.get_inference_statistics("higgs_audio_v2_decoder", as_json=True)["model_stats"][0]
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))

    before = counts()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda seed: speak(http, seed=seed), range(20, 24)))
    assert all(r.status_code == 200 for r in results) and all(rms(pcm16(r.content)) > 1e-3 for r in results)
    after = counts()
    inferences, executions = after[0] - before[0], after[1] - before[1]
    print(f"decoder: {inferences} chunks in {executions} executions")
    assert executions < inferences


@pytest.mark.parametrize("fields,needle", [
    ({"instructions": "whisper"}, "no style instructions"),
    ({"task_type": "Base"}, "omit task_type"),
    ({"language": "French"}, "omit language"),
    ({"input": "[SPEAKER0] Hello. [SPEAKER1] Hi."}, r"\[SPEAKER0\]"),
    ({"voice": "alice"}, "no preset speakers"),
    # vLLM-Omni's explicit refusals of upstream's other prompt forms.
    ({"voice": "profile:male_en_british"}, "profile: text-only speaker descriptions are not served"),
    ({"ref_audio_in_system_message": True, **REF}, "system-message block is not served"),
    ({"speakers": ["a", "b"]}, "multi-speaker dialogue is not served"),
    ({"messages": [{"role": "user", "content": "Hi."}]}, "conversation is not served"),
    ({"ref_audio": REF["ref_audio"]}, "needs ref_text"),
    ({"ref_text": "hello"}, "send ref_audio with it"),
    ({"temperature": 3.0}, "temperature"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_what_the_model_cannot_do_is_a_400_that_says_so(http, fields, needle):
    import re

    r = speak(http, **fields)
    assert r.status_code == 400, r.text
    assert re.search(needle, r.json()["error"]["message"]), r.text
    assert http.get("/health").status_code == 200
