"""CosyVoice3 talker: checkpoint layout, yaml-as-data, tokenizer, RAS, and the converted
vLLM checkpoint against a plain transformers forward of the original llm.pt."""
from __future__ import annotations

import gc
import os
import random
from pathlib import Path

import pytest
import torch

from tritontts.families.cosyvoice3.checkpoint import CheckpointError, open_checkpoint
from tritontts.weights.hyperpyyaml import load_hyperpyyaml
from tritontts.families.cosyvoice3.talker import SPEECH_VOCAB, convert_llm_checkpoint
from tritontts.nn.ras import ras_distribution, ras_extra_args
from tritontts.families.cosyvoice3.tokenizer import CosyVoice3TextTokenizer
from tritontts.testing.engine import close_engine, in_process_llm


@pytest.fixture(scope="module")
def tiny(tiny_cosyvoice3) -> Path:
    return tiny_cosyvoice3


YAML = """
__set_seed1: !apply:os.system ["touch /tmp/tritontts-yaml-executed"]
sample_rate: 24000
llm_input_size: 128
token_mel_ratio: 2
chunk_size: 25
llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_k: 25
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    sampling_rate: !ref <sample_rate>
"""


def test_yaml_is_read_as_data_never_executed(tmp_path):
    if os.path.exists("/tmp/tritontts-yaml-executed"):
        os.remove("/tmp/tritontts-yaml-executed")
    (tmp_path / "cosyvoice3.yaml").write_text(YAML)
    config = load_hyperpyyaml(tmp_path / "cosyvoice3.yaml", {"qwen_pretrain_path": "/ckpt/CosyVoice-BlankEN"})
    assert not os.path.exists("/tmp/tritontts-yaml-executed")
    assert config["__set_seed1"] == {"__apply__": "os.system", "args": ["touch /tmp/tritontts-yaml-executed"]}
    assert config["llm"]["__class__"] == "cosyvoice.llm.llm.CosyVoice3LM"
    assert config["llm"]["llm"]["pretrain_path"].endswith("CosyVoice-BlankEN")
    assert config["flow"]["static_chunk_size"] == 50
    assert config["hift"]["sampling_rate"] == 24000
    assert config["llm"]["sampling"]["top_k"] == 25


def test_missing_or_malformed_files_are_named(tiny, tmp_path):
    import shutil

    broken = tmp_path / "ckpt"
    shutil.copytree(tiny, broken)
    (broken / "campplus.onnx").unlink()
    with pytest.raises(CheckpointError, match="campplus.onnx: missing"):
        open_checkpoint(broken)
    shutil.copy(tiny / "campplus.onnx", broken / "campplus.onnx")
    (broken / "cosyvoice3.yaml").write_text("llm: !ref <nowhere>\n")
    with pytest.raises(CheckpointError, match="cosyvoice3.yaml.*nowhere"):
        open_checkpoint(broken)
    shutil.copy(tiny / "cosyvoice3.yaml", broken / "cosyvoice3.yaml")
    (broken / "llm.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="llm.pt: not a readable state dict"):
        open_checkpoint(broken).state_dict("llm.pt")
    with pytest.raises(CheckpointError, match="not found"):
        open_checkpoint(tmp_path / "absent")


def test_tokenizer_adds_cosyvoice3_special_tokens(tiny):
    tok = CosyVoice3TextTokenizer(tiny / "CosyVoice-BlankEN")
    ids = tok.prompt_text_ids("Hello there.")
    assert tok.end_of_prompt_id in ids
    assert ids[ids.index(tok.end_of_prompt_id) + 1:] == tok.encode("Hello there.")
    assert tok.encode("[breath]") == [tok.end_of_prompt_id + 1]  # order fixes the ids


def _upstream_ras_draw(logits, recent, rng, top_p=0.8, top_k=25, win=10, tau=0.1):
    """The upstream procedure, step by step, as the reference for the closed form."""
    p = logits.softmax(-1)
    values, order = p.sort(descending=True, stable=True)
    kept, mass = [], 0.0
    for v, i in zip(values.tolist(), order.tolist()):
        if mass < top_p and len(kept) < top_k:
            kept.append((i, v))
            mass += v
        else:
            break
    ids, probs = zip(*kept)
    x = rng.choices(ids, weights=probs)[0]
    if recent[-win:].count(x) >= win * tau:
        rest = p.clone()
        rest[x] = 0
        x = rng.choices(range(len(p)), weights=rest.tolist())[0]
    return x


def test_ras_distribution_equals_the_upstream_procedure():
    torch.manual_seed(0)
    logits = torch.randn(40) * 2
    recent = [int(logits.argmax()), 3, 3, 7]  # the top token was just generated
    dist = ras_distribution(logits, recent, 0.8, 25, 10, 0.1)
    assert abs(float(dist.sum()) - 1) < 1e-5
    rng = random.Random(0)
    n = 40000
    counts = torch.zeros(40)
    for _ in range(n):
        counts[_upstream_ras_draw(logits, recent, rng)] += 1
    diff = float((counts / n - dist).abs().max())
    print(f"RAS closed form vs upstream procedure, max |freq - p|: {diff:.4f}")
    assert diff < 0.01
    assert float(dist[int(logits.argmax())]) < 0.05  # the repeated top token is mostly banned


def _reference_logits(tiny, prompt_text_ids, text_ids, prompt_speech, steps):
    """Upstream CosyVoice3LM semantics on the ORIGINAL llm.pt: embeddings from the two
    tables, Qwen2 body, llm_decoder head; greedy decoding for `steps` tokens."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    state = torch.load(tiny / "llm.pt", weights_only=True)
    config = Qwen2Config.from_pretrained(tiny / "CosyVoice-BlankEN")
    qwen = Qwen2ForCausalLM(config).eval()
    qwen.load_state_dict({k[len("llm.model."):]: v for k, v in state.items()
                          if k.startswith("llm.model.")}, strict=True)
    speech_emb, decoder = state["speech_embedding.weight"], state["llm_decoder.weight"]
    embed = qwen.model.embed_tokens
    with torch.inference_mode():
        x = torch.cat([speech_emb[6561][None], embed(torch.tensor(prompt_text_ids + text_ids)),
                       speech_emb[6563][None], speech_emb[torch.tensor(prompt_speech)]])[None]
        out, logits_per_step = [], []
        for _ in range(steps):
            h = qwen.model(inputs_embeds=x).last_hidden_state[0, -1]
            logits = decoder @ h
            logits_per_step.append(logits)
            token = int(logits.argmax())
            out.append(token)
            x = torch.cat([x, speech_emb[token][None, None]], dim=1)
    return out, logits_per_step


@pytest.fixture(scope="module")
def vllm_talker(tiny, tmp_path_factory):
    from tritontts.engine.vllm_ras import RAS_LOGITS_PROCESSOR

    ckpt = open_checkpoint(tiny)
    import json
    text_config = json.loads((ckpt.text_model_dir / "config.json").read_text())
    out = tmp_path_factory.mktemp("talker")
    vocab = convert_llm_checkpoint(ckpt.state_dict("llm.pt"), text_config, out)
    # A fixed KV cache, not a share of memory (in_process_llm: vLLM's CPU worker sizes a
    # share from the NUMA node's memory, 13.8 GB on one machine of 23 GiB, less what earlier
    # tests' engines still hold, and then refused this one); 256 MiB as the tiny servers'.
    llm = in_process_llm(out, 256 << 20, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                         max_model_len=1024, enable_prefix_caching=False, seed=0,
                         logits_processors=[RAS_LOGITS_PROCESSOR])
    yield llm, vocab, ckpt
    # Closed here, not by the garbage collector: it also tears down vLLM's process-wide
    # parallel state, which a later module's own vLLM layers would otherwise find taken.
    close_engine(llm)
    del llm
    gc.collect()


def test_vllm_talker_matches_transformers_forward(tiny, vllm_talker):
    from vllm import SamplingParams, TokensPrompt

    llm, vocab, ckpt = vllm_talker
    tok = CosyVoice3TextTokenizer(ckpt.text_model_dir)
    prompt_text, text = tok.prompt_text_ids("Hello there."), tok.encode("How are you today?")
    prompt_speech = [5, 77, 1234, 6000, 42]
    steps = 24
    ref_tokens, ref_logits = _reference_logits(tiny, prompt_text, text, prompt_speech, steps)

    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=20,
                            allowed_token_ids=vocab.allowed_ids, detokenize=False)
    result = llm.generate(TokensPrompt(prompt_token_ids=vocab.prompt_ids(prompt_text + text, prompt_speech)),
                          params, use_tqdm=False)[0].outputs[0]
    got = [vocab.to_speech(t) for t in result.token_ids]
    assert got == ref_tokens
    # Logprob differences equal logit differences, whatever the normalization.
    worst = 0.0
    for step, logprobs in enumerate(result.logprobs):
        ids = sorted(logprobs)
        top = result.token_ids[step]
        for token_id in ids:
            vllm_delta = logprobs[token_id].logprob - logprobs[top].logprob
            ref_delta = float(ref_logits[step][vocab.to_speech(token_id)] - ref_logits[step][vocab.to_speech(top)])
            worst = max(worst, abs(vllm_delta - ref_delta))
    print(f"vLLM vs transformers: {steps} greedy tokens equal; max-abs-diff of logit gaps {worst:.2e}")
    assert worst < 1e-3


def test_vllm_ras_sampling_is_seeded_and_stays_in_speech_range(vllm_talker):
    from vllm import SamplingParams, TokensPrompt

    llm, vocab, ckpt = vllm_talker
    prompt = TokensPrompt(prompt_token_ids=vocab.prompt_ids([10, 11, 12], [1, 2, 3]))

    def run(seed):
        params = SamplingParams(temperature=1.0, max_tokens=40, seed=seed, detokenize=False,
                                allowed_token_ids=vocab.allowed_ids, stop_token_ids=vocab.stop_ids,
                                extra_args=ras_extra_args(vocab.speech_offset, SPEECH_VOCAB, ckpt.config["llm"]["sampling"]))
        return list(llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids)

    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    for tokens in (a, c):
        speech = [vocab.to_speech(t) for t in tokens]
        assert all(0 <= s < SPEECH_VOCAB for s in speech)
        body = speech[:-1] if speech and speech[-1] >= 6561 else speech
        assert all(s < 6561 for s in body)


def test_a_request_samples_by_its_method_else_the_stage_default_with_that_methods_knobs():
    """RAS (upstream's) by default; standard sampling (vLLM-Omni's GPU profile) when the request
    or the talker's model.json sampling_method says so; a knob of the other method is a 400."""
    from tritontts.families.cosyvoice3.request import STANDARD_SAMPLING, parse_cosyvoice3_params
    from tritontts.families.cosyvoice3.stages import CosyVoice3TalkerStage
    from tritontts.protocol import InvalidRequest

    stage = object.__new__(CosyVoice3TalkerStage)
    stage.sampling = {"top_p": 0.8, "top_k": 25, "win_size": 10, "tau_r": 0.1}
    stage.settings = {"sampling_method": "ras"}
    assert stage.request_sampling({}) == {**stage.sampling, "sampling_method": "ras"}
    assert stage.request_sampling({"sampling_method": "standard", "top_k": 5}) == {
        **STANDARD_SAMPLING, "top_k": 5, "sampling_method": "standard"}
    stage.settings = {"sampling_method": "standard"}
    assert stage.request_sampling({"temperature": 0.9})["temperature"] == 0.9
    with pytest.raises(InvalidRequest, match="win_size is a knob of ras sampling"):
        stage.request_sampling({"win_size": 4})
    ref = {"ref_audio": "UklGRg==", "ref_text": "Hi."}
    assert parse_cosyvoice3_params({**ref, "sampling_method": "standard", "temperature": 0.5}).sampling == {
        "sampling_method": "standard", "temperature": 0.5}
    with pytest.raises(InvalidRequest, match="temperature is a knob of standard sampling"):
        parse_cosyvoice3_params({**ref, "sampling_method": "ras", "temperature": 0.5})
    with pytest.raises(InvalidRequest, match="sampling_method must be one of"):
        parse_cosyvoice3_params({**ref, "sampling_method": "beam"})


@pytest.mark.parametrize("budget,bounds,finals", [
    (0, [(4, 40), (4, 40), (4, 40)], [False, False, True]),     # no max_new_tokens
    (50, [(4, 40), (4, 10)], [False, True]),                     # into the second segment
    (40, [(4, 40)], [True]),                                      # spent by the first exactly
    (2, [(2, 2)], [True]),                                        # below a segment's minimum
])
def test_max_new_tokens_cuts_the_segments_bounds_and_the_segment_that_spends_it_is_final(
        budget, bounds, finals):
    """The talker's loop over segments, with a talk() that runs each segment to its cap:
    each segment is asked for at most what is left of the request's budget, and the stream
    ends (final) with the segment that spends it."""
    import asyncio
    from types import SimpleNamespace

    import numpy as np

    from tritontts.engine.vllm_talker import TOKEN_BUDGET
    from tritontts.families.cosyvoice3.stages import CosyVoice3TalkerStage
    from tritontts.protocol import IS_FINAL, STREAM_ID
    from tritontts.serving.stage import Inputs

    asked = []

    async def talk(request_id, prompt_ids, low, high, seed, prompt_tokens, cancelled, ras):
        asked.append((low, high))
        yield list(range(high)), SimpleNamespace(tokens_upto=high, token_offset=0, segment_end=True)

    stage = object.__new__(CosyVoice3TalkerStage)
    stage.talk = talk
    stage.request_sampling = lambda overrides: {}
    inputs = Inputs(prompt_ids=np.arange(9), segment_lengths=np.array([3, 3, 3]),
                    min_tokens=np.array([4, 4, 4]), max_tokens=np.array([40, 40, 40]),
                    seed=np.array([1]), prompt_tokens=np.arange(5), **{STREAM_ID: np.array([7]),
                    TOKEN_BUDGET: np.array([budget], np.int32)})

    async def responses():
        return [r async for r in stage.run(inputs)]
    got = asyncio.run(responses())
    assert asked == bounds
    assert [bool(r[IS_FINAL]) for r in got] == finals
    assert sum(len(r["speech_tokens"]) for r in got) == sum(high for _, high in bounds)


@pytest.mark.parametrize("value", [0, 4097, 2.5, "100", True])
def test_max_new_tokens_outside_1_to_4096_is_refused_naming_the_range(value):
    from tritontts.families.cosyvoice3.request import parse_cosyvoice3_params
    from tritontts.protocol import InvalidRequest

    ref = {"ref_audio": "UklGRg==", "ref_text": "Hi."}
    with pytest.raises(InvalidRequest, match="max_new_tokens must be an integer from 1 to 4096"):
        parse_cosyvoice3_params({**ref, "max_new_tokens": value})
    assert parse_cosyvoice3_params({**ref, "max_new_tokens": 100}).max_new_tokens == 100
    assert parse_cosyvoice3_params({"voice_features": "AAAA", "max_new_tokens": 7}).max_new_tokens == 7
