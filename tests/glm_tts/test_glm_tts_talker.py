"""The GLM-TTS talker side: text tokenizer, segment prompt and history pruning, chunk plan,
the Llama on stock vLLM against transformers, and repetition-aware sampling (RAS) in the
vLLM logits processor, on the tiny random checkpoint (fp32).

The expected behaviour is upstream GLM-TTS's (zai-org/GLM-TTS), written out here from
reading it: llm/glmtts.py `GLMTTS.inference` (prompt [prompt text, text, boa, prompt speech
+ ats]; log_softmax, <|user|> masked to -inf while fewer than min_len tokens exist, then
ras_sampling), glmtts_inference.py `get_cached_prompt` (history pruning) and
`get_special_token_ids`, utils/tts_model_util.py `token2wav_stream` /
`iterate_list_in_chunks` (chunks), cosyvoice/utils/common.py `ras_sampling` (nucleus top_p
0.8 / top_k 25; a repeated draw is redrawn from the full softmax, the repeated token *not*
banned, unlike CosyVoice's). Our RAS runs over the candidate rows (the 32768 audio rows and
<|user|>) only, so the upstream procedure is restricted to those rows here.
"""
from __future__ import annotations

import asyncio
import gc
import json
import shutil

import pytest
import torch

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.glm_tts.checkpoint import TOKENIZER_DIR
from tritontts.families.glm_tts.talker import (
    RAS_DEFAULTS, Chunker, History, segment_prompt, token_bounds)
from tritontts.families.glm_tts.tokenizer import AUDIO_TOKENS, GLMTextTokenizer
from tritontts.nn.ras import ras_distribution, ras_extra_args

# Upstream's constants, restated (not imported) so a change to ours shows up as a failure.
UPSTREAM_MAX_PROMPT_SPEECH = 750
UPSTREAM_RAS = dict(top_p=0.8, top_k=25, win_size=10, tau_r=0.1)
REF_TEXT = "This is the reference voice. "          # upstream appends the space
TEXT = "Hello world, this is a test."


@pytest.fixture(scope="module")
def ckpt(random_checkpoints):
    return random_checkpoints["glm_tts"]


@pytest.fixture(scope="module")
def tok(ckpt) -> GLMTextTokenizer:
    return GLMTextTokenizer(ckpt / TOKENIZER_DIR)


# --- tokenizer -------------------------------------------------------------------------

def test_special_tokens_encode_to_one_id_each_and_audio_ids_are_consecutive(tok):
    # upstream get_special_token_ids: each encodes to exactly one id, none below <|endoftext|>
    endoftext = tok.encode("<|endoftext|>")
    assert len(endoftext) == 1
    for name, text in {"ats": "<|audio_0|>", "ate": "<|audio_32767|>", "boa": "<|begin_of_audio|>",
                       "eoa": "<|user|>", "pad": "<|endoftext|>"}.items():
        ids = tok.encode(text)
        assert len(ids) == 1 and ids[0] >= endoftext[0], name
        if name != "ate":
            assert ids[0] == getattr(tok.ids, name), name
    ats = tok.ids.ats
    assert [tok.added[f"<|audio_{n}|>"] for n in range(AUDIO_TOKENS)] == list(range(ats, ats + AUDIO_TOKENS))
    assert tok.encode("<|audio_32767|>") == [ats + AUDIO_TOKENS - 1]
    assert tok.ids.speech(ats + 4321) == 4321
    # ChatGLM4's order puts <|user|> 7 after <|endoftext|> (released: 59246 + 7 = 59253).
    assert tok.ids.eoa == tok.ids.pad + 7


def test_encode_adds_no_prefix_or_suffix_and_added_tokens_in_text_become_their_ids(tok):
    assert tok.encode("") == []
    assert tok.encode("a") == [ord("a")]                     # single bytes are their own rank
    # Pre-tokenisation splits "Hello world." as "Hello" | " world" | "."; no ids around it.
    assert tok.encode("Hello world.") == tok.encode("Hello") + tok.encode(" world") + tok.encode(".")
    assert tok.decode(tok.encode(TEXT)) == TEXT
    ids = tok.ids
    assert tok.encode("Hi<|begin_of_audio|><|audio_7|><|user|> x") == (
        tok.encode("Hi") + [ids.boa, ids.ats + 7, ids.eoa] + tok.encode(" x"))


def _hf_tokenizer(folder, pattern=None):
    """The same files read by transformers' own tiktoken converter into a HF `tokenizers`
    BPE (merges recovered from the ranks, its own copy of the cl100k / ChatGLM4 split
    pattern), added tokens appended in id order: a second implementation of the tokenizer."""
    pytest.importorskip("tiktoken")
    converter = pytest.importorskip("transformers.convert_slow_tokenizer")
    from tokenizers import AddedToken

    kwargs = {} if pattern is None else {"pattern": pattern}
    hf = converter.TikTokenConverter(vocab_file=str(folder / "tokenizer.model"), **kwargs).converted()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    added = sorted((int(i), e["content"]) for i, e in config["added_tokens_decoder"].items())
    hf.add_special_tokens([AddedToken(content, normalized=False, special=True) for _, content in added])
    assert all(hf.token_to_id(content) == i for i, content in added)
    return hf


SAMPLES = ["The quick brown fox jumps over the lazy dog.", TEXT, REF_TEXT,
           "Streaming speech from text, sentence by sentence.\n\nOne two  three",
           "don't DON'T it's 1234567 über 日本語 ¿qué?", "x<|audio_5|><|audio_12|>y<|user|>",
           "   leading and trailing   ", "tab\tand\r\nnewlines\n"]


def test_encode_equals_transformers_tiktoken_converter_on_the_same_files(ckpt, tok):
    hf = _hf_tokenizer(ckpt / TOKENIZER_DIR)
    for text in SAMPLES:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
    # Meaningful only if merges happen: corpus words become multi-byte tokens.
    assert any(i >= 256 for i in tok.encode(SAMPLES[0]) if i < tok.ids.pad)


def test_control_a_tokenizer_with_another_split_pattern_encodes_differently(ckpt, tok):
    hf = _hf_tokenizer(ckpt / TOKENIZER_DIR, pattern=r"\s+|\S+")    # spaces never join words
    assert any(tok.encode(t) != hf.encode(t, add_special_tokens=False).ids for t in SAMPLES)


def test_corrupt_or_incomplete_tokenizer_files_raise_checkpoint_error_naming_the_file(ckpt, tmp_path):
    good = ckpt / TOKENIZER_DIR
    folder = tmp_path / TOKENIZER_DIR
    shutil.copytree(good, folder)
    model, config = folder / "tokenizer.model", folder / "tokenizer_config.json"

    config.write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer_config.json"):
        GLMTextTokenizer(folder)
    data = json.loads((good / "tokenizer_config.json").read_text())
    user = next(i for i, e in data["added_tokens_decoder"].items() if e["content"] == "<|user|>")
    del data["added_tokens_decoder"][user]
    config.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"tokenizer_config.json.*<\|user\|>"):
        GLMTextTokenizer(folder)
    data = json.loads((good / "tokenizer_config.json").read_text())
    entries = data["added_tokens_decoder"]
    a, b = (next(i for i, e in entries.items() if e["content"] == f"<|audio_{n}|>") for n in (1, 16384))
    entries[a], entries[b] = entries[b], entries[a]          # audio ids no longer consecutive
    config.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="tokenizer_config.json.*consecutive"):
        GLMTextTokenizer(folder)
    shutil.copy(good / "tokenizer_config.json", config)

    lines = (good / "tokenizer.model").read_text().splitlines()
    lines[2] = "!!!not-base64 2"
    model.write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match=r"tokenizer.model:3"):
        GLMTextTokenizer(folder)
    model.unlink()
    with pytest.raises(CheckpointError, match="tokenizer.model: missing"):
        GLMTextTokenizer(folder)


# --- segment prompt and history ----------------------------------------------------------

BOA, ATS = 9000, 10000          # stand-in ids: the layout, not the values, is under test


def test_segment_prompt_is_prompt_text_history_texts_text_boa_then_prompt_and_history_speech():
    history = History()
    assert segment_prompt([1, 2, 3], [5, 6], [20, 21], history, BOA, ATS) == \
        [1, 2, 3, 20, 21, 9000, 10005, 10006]
    history.add([10, 11], [7, 8, 9])
    history.add([12], [4])
    assert segment_prompt([1, 2, 3], [5, 6], [20, 21], history, BOA, ATS) == \
        [1, 2, 3, 10, 11, 12, 20, 21, 9000, 10005, 10006, 10007, 10008, 10009, 10004]


def _history(segments):
    """Segments k = (text length, speech length), with ids that tell them apart."""
    history = History()
    for k, (text_len, speech_len) in enumerate(segments):
        history.add([100 * k + i for i in range(text_len)], [1000 * k + i for i in range(speech_len)])
    return history


def _kept(history):
    return [seg[0] // 100 for seg in history.texts]


# (prompt text len, prompt speech len, history segments, next text len, segments kept)
PRUNE_CASES = [
    # 250 + 250 speech over 20 text tokens: estimate 25 * 10 = 250, total exactly 750: kept
    (10, 250, [(10, 250)], 10, [0]),
    # estimate int(25 * 11) = 275: 775 > 750, the history goes
    (10, 250, [(10, 250)], 11, []),
    # estimate int(700 / 70 * 10) = 100, fixed before dropping: 800 > 750 drops segment 0,
    # then 600 + 100 <= 750 keeps segment 1 (re-estimating at 600 / 20 would drop it too)
    (10, 100, [(50, 100), (10, 500)], 10, [1]),
    # oldest first, until it fits: 100 + 3*240 = 820, estimate int(820/40*10) = 205; drops
    # segment 0 (1025), then 1 (580 + 205), keeps 2 (340 + 205 <= 750)
    (10, 100, [(10, 240), (10, 240), (10, 240)], 10, [2]),
    # the reference alone passes 750: every history segment goes, the reference stays
    (10, 800, [(5, 10), (5, 10)], 10, []),
    # empty history: nothing to drop
    (10, 800, [], 10, []),
]


def _prune_reestimating(prompt_text, prompt_speech, next_text, history):
    """Control: the rule with the estimate recomputed after every drop (not upstream's)."""
    while history.texts:
        text_len = len(prompt_text) + sum(map(len, history.texts))
        speech_len = len(prompt_speech) + sum(map(len, history.speech))
        if speech_len + int(speech_len / max(text_len, 1) * len(next_text)) <= UPSTREAM_MAX_PROMPT_SPEECH:
            return
        history.texts.pop(0)
        history.speech.pop(0)


@pytest.mark.parametrize("prompt_text_len, prompt_speech_len, segments, next_len, kept", PRUNE_CASES)
def test_prune_drops_oldest_history_while_speech_plus_estimate_passes_750_as_get_cached_prompt(
        prompt_text_len, prompt_speech_len, segments, next_len, kept):
    prompt_text, prompt_speech = list(range(prompt_text_len)), list(range(prompt_speech_len))
    history = _history(segments)
    history.prune(prompt_text, prompt_speech, list(range(next_len)))
    assert _kept(history) == kept
    assert len(history.texts) == len(history.speech)
    ids = segment_prompt(prompt_text, prompt_speech, [7] * next_len, history, BOA, ATS)
    assert ids[:prompt_text_len] == prompt_text                      # the reference stays
    assert ids[ids.index(BOA) + 1:][:prompt_speech_len] == [ATS + s for s in prompt_speech]


def test_prune_keeps_the_named_segments_in_a_small_explicit_case():
    history = _history([(2, 3), (1, 2)])
    history.prune([1], [5] * 745, [7])        # speech 750, estimate int(750 / 4 * 1) = 187
    assert history.texts == [] and history.speech == []
    history = _history([(2, 3), (1, 2)])
    history.prune([1], [5], [7])              # speech 6, estimate int(6 / 4) = 1: all kept
    assert segment_prompt([1], [5], [7], history, BOA, ATS) == [1, 0, 1, 100, 7, 9000, 10005, 10000,
                                                                  10001, 10002, 11000, 11001]


def test_control_reestimating_after_each_drop_prunes_differently():
    prompt_text, prompt_speech = list(range(10)), list(range(100))
    history = _history([(50, 100), (10, 500)])
    _prune_reestimating(prompt_text, prompt_speech, list(range(10)), history)
    assert _kept(history) == []               # upstream (and ours) keep segment 1


def test_token_bounds_are_2_and_20_tokens_per_text_token():
    assert token_bounds(7) == (14, 140)


# --- chunk plan --------------------------------------------------------------------------

# Upstream iterate_list_in_chunks(range(n), [25, 50, 200]): cumulative chunk ends.
UPSTREAM_CHUNK_ENDS = {1: [1], 24: [24], 25: [25], 26: [25, 26], 75: [25, 75], 76: [25, 75, 76],
                       300: [25, 75, 275, 300], 475: [25, 75, 275, 475],
                       700: [25, 75, 275, 475, 675, 700]}


def _drive(chunker, total, step=1):
    """Tokens arrive `step` at a time (the last burst may be shorter), then the end."""
    chunks, n = [], 0
    while n < total:
        n = min(total, n + step)
        while (chunk := chunker.poll(n)) is not None:
            chunks.append(chunk)
    return chunks + [chunker.finish(total)]


@pytest.mark.parametrize("total", sorted(UPSTREAM_CHUNK_ENDS))
@pytest.mark.parametrize("step", [1, 7, 1000])
def test_chunk_ends_equal_upstream_iterate_list_in_chunks(total, step):
    chunks = _drive(Chunker(), total, step)
    assert [c.tokens for c in chunks] == UPSTREAM_CHUNK_ENDS[total]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]


def test_look_ahead_is_12_25_100_then_100_and_0_on_the_last_chunk():
    chunks = _drive(Chunker(), 700)
    assert [c.look_ahead for c in chunks] == [12, 25, 100, 100, 100, 0]
    assert [c.look_ahead for c in _drive(Chunker(), 26)] == [12, 0]


def test_a_boundary_is_passed_on_only_once_a_token_beyond_it_exists():
    chunker = Chunker()
    assert chunker.poll(25) is None           # 25 could still be the last token
    assert chunker.finish(25).last            # ...and it was: one chunk, the last
    chunker = Chunker()
    assert chunker.poll(25) is None
    first = chunker.poll(26)
    assert (first.tokens, first.last, first.look_ahead) == (25, False, 12)
    assert chunker.poll(75) is None and chunker.poll(76).tokens == 75


def test_control_other_block_sizes_give_other_chunk_ends():
    assert [c.tokens for c in _drive(Chunker(block_sizes=(25, 50, 100)), 300)] != UPSTREAM_CHUNK_ENDS[300]


# --- RAS in the vLLM logits processor ----------------------------------------------------

MIN_TOKENS = 4


def _candidate_logits(vocab, ats, eoa):
    """Logits for one row: noise everywhere, a few audio rows and <|user|> well above it, a
    text row above all (never a candidate). Audio 3 (the one in the window), <|user|> and
    audio 9 and 100 form the nucleus with <|user|>; without it, audio 7 joins instead."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(vocab, generator=g)
    for row, value in ((ats + 3, 12.0), (eoa, 11.8), (ats + 9, 11.5), (ats + 100, 11.0),
                       (ats + 7, 10.5), (50, 14.0)):
        logits[row] = value
    return logits


def _processor_rows(tok, vocab):
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from tritontts.engine.vllm_ras import RasLogitsProcessor

    ids = tok.ids
    proc = RasLogitsProcessor(None, torch.device("cpu"), False)
    ras = SamplingParams(extra_args=ras_extra_args(ids.ats, AUDIO_TOKENS, RAS_DEFAULTS, extra_ids=[ids.eoa],
                                                   min_tokens=MIN_TOKENS, stop_ids=[ids.eoa]))
    output = [ids.ats + 50, ids.ats + 3]      # vLLM's live list of generated ids
    proc.update_state(BatchUpdate(batch_size=2, removed=[], moved=[],
                                  added=[(0, SamplingParams(), [1, 2], []), (1, ras, [1, 2], output)]))
    logits = _candidate_logits(vocab, ids.ats, ids.eoa)
    return proc, output, logits


def _candidates(tok):
    return torch.cat([torch.arange(tok.ids.ats, tok.ids.ats + AUDIO_TOKENS), torch.tensor([tok.ids.eoa])])


def _applied(proc, logits):
    batch = torch.stack([logits, logits])
    return proc.apply(batch.clone())


def test_ras_processor_gives_ras_over_audio_rows_and_eoa_with_eoa_masked_until_min_tokens(tok):
    vocab = tok.vocab_size
    proc, output, logits = _processor_rows(tok, vocab)
    cand, eoa_index = _candidates(tok), AUDIO_TOKENS
    others = torch.ones(vocab, dtype=torch.bool)
    others[cand] = False

    def expected(masked):
        scores = logits[cand].clone()
        if masked:
            scores[eoa_index] = float("-inf")
        recent = [t - tok.ids.ats for t in output]
        return ras_distribution(scores, recent, **UPSTREAM_RAS, ban_repeated=False)

    out = _applied(proc, logits)
    assert torch.equal(out[0], logits)                       # a request without RAS: untouched
    assert torch.isneginf(out[1][others]).all()              # text rows are never candidates
    got = out[1][cand].exp()
    assert float(got[eoa_index]) == 0.0                      # 2 of 4 tokens out: eoa masked
    assert float((got - expected(True)).abs().max()) < 1e-6
    output.extend([tok.ids.ats + 60, tok.ids.ats + 70])      # min_tokens reached
    got = _applied(proc, logits)[1][cand].exp()
    assert float(got[eoa_index]) > 0.1
    assert float((got - expected(False)).abs().max()) < 1e-6
    assert abs(float(got.sum()) - 1) < 1e-5


def _upstream_glm_draws(cand_logits, recent, masked, n, seed, ban=False):
    """n draws by upstream GLMTTS.inference's step, restricted to the candidates: log_softmax,
    eoa (the last candidate) to -inf before min_len, nucleus_sampling's loop, and if the
    draw is among the last win_size tokens, random_sampling from the full softmax (which
    in GLM-TTS does not ban the repeated token; `ban` gives CosyVoice's, as a control)."""
    g = torch.Generator().manual_seed(seed)
    logp = cand_logits.log_softmax(0)
    if masked:
        logp[-1] = float("-inf")
    p = logp.softmax(0)
    values, order = p.sort(descending=True, stable=True)
    kept_p, kept_i, cum = [], [], 0.0
    for v, i in zip(values.tolist(), order.tolist()):
        if cum < UPSTREAM_RAS["top_p"] and len(kept_p) < UPSTREAM_RAS["top_k"]:
            cum += v
            kept_p.append(v)
            kept_i.append(i)
        else:
            break
    draws = torch.tensor(kept_i)[torch.multinomial(torch.tensor(kept_p), n, replacement=True, generator=g)]
    window = recent[-UPSTREAM_RAS["win_size"]:]
    threshold = UPSTREAM_RAS["win_size"] * UPSTREAM_RAS["tau_r"]
    first = draws.clone()                     # a redrawn token is not checked again
    for x in first.unique().tolist():
        if window.count(x) >= threshold:
            again = first == x
            q = p.clone()
            if ban:
                q[x] = 0.0
            draws[again] = torch.multinomial(q, int(again.sum()), replacement=True, generator=g)
    return draws


def _max_freq_gap(draws, dist, top=40):
    """Max |frequency - probability| over the most likely tokens and the rest as one bucket."""
    freq = torch.bincount(draws, minlength=dist.numel()).double() / draws.numel()
    dist = dist.double()
    head = dist.argsort(descending=True)[:top]
    gaps = (freq[head] - dist[head]).abs()
    rest = abs((1 - float(freq[head].sum())) - (1 - float(dist[head].sum())))
    return max(float(gaps.max()), rest)


@pytest.mark.parametrize("masked", [True, False])
def test_ras_processor_distribution_equals_upstream_glm_sampling_monte_carlo(tok, masked):
    proc, output, logits = _processor_rows(tok, tok.vocab_size)
    if not masked:
        output.extend([tok.ids.ats + 60, tok.ids.ats + 70])
    cand = _candidates(tok)
    dist = _applied(proc, logits)[1][cand].exp()
    recent = [t - tok.ids.ats for t in output]
    n = 400_000
    gap = _max_freq_gap(_upstream_glm_draws(logits[cand], recent, masked, n, seed=1), dist)
    print(f"masked={masked}: processor vs upstream procedure ({n} draws), max |freq - p| {gap:.4f}")
    assert gap < 0.005                        # ~7 sigma at p = 0.3
    # Controls: CosyVoice's banning redraw, and <|user|> masked after RAS instead of before.
    ban_gap = _max_freq_gap(_upstream_glm_draws(logits[cand], recent, masked, n, seed=2, ban=True), dist)
    print(f"masked={masked}: control (repeated token banned) max |freq - p| {ban_gap:.4f}")
    assert ban_gap > 0.05
    if masked:
        after = ras_distribution(logits[cand], recent, **UPSTREAM_RAS, ban_repeated=False)
        after[-1] = 0.0
        after /= after.sum()
        assert float((after - dist).abs().max()) > 0.05


# --- the Llama on vLLM vs transformers ----------------------------------------------------

STEPS = 30


def _glm_prompts(tok):
    """Three talker prompts: with reference speech, without, and with a history segment.
    (The tiny talker's greedy output soon settles on one audio token; these three leave it
    at different steps, so the comparison sees several token changes.)"""
    ref, text = tok.encode(REF_TEXT), tok.encode(TEXT)
    speech = torch.randint(0, AUDIO_TOKENS, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    history = History()
    history.add(tok.encode("One two three."), list(range(500, 530)))
    ids = tok.ids
    return [segment_prompt(ref, speech, text, History(), ids.boa, ids.ats),
            segment_prompt(ref, [], text, History(), ids.boa, ids.ats),
            segment_prompt(ref, speech, tok.encode("The quick brown fox."), history, ids.boa, ids.ats)]


@pytest.fixture(scope="module")
def llm(ckpt):
    from tritontts.testing.engine import close_engine, in_process_llm
    from tritontts.engine.vllm_ras import RAS_LOGITS_PROCESSOR

    # In-process core and a fixed 64 MiB KV cache, as other talker tests (in_process_llm).
    engine = in_process_llm(ckpt / "llm", 64 * 2**20, skip_tokenizer_init=True, dtype="float32",
                            enforce_eager=True, max_model_len=1024, max_num_seqs=4,
                            enable_prefix_caching=False, seed=0, logits_processors=[RAS_LOGITS_PROCESSOR])
    yield engine
    close_engine(engine)
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def hf_llama(ckpt):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(ckpt / "llm"), dtype=torch.float32).eval()


def _hf_greedy(model, prompt):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=STEPS, min_new_tokens=STEPS)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def vllm_greedy(llm, tok):
    """The three prompts submitted together (one batch), greedy, no RAS."""
    from vllm import SamplingParams, TokensPrompt

    prompts = _glm_prompts(tok)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, min_tokens=STEPS, logprobs=20,
                            prompt_logprobs=20, detokenize=False)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return list(zip(prompts, results))


def test_vllm_greedy_tokens_equal_transformers_generate_from_glm_prompts(hf_llama, vllm_greedy):
    changes = 0
    for k, (prompt, result) in enumerate(vllm_greedy):
        got = list(result.outputs[0].token_ids)
        want = _hf_greedy(hf_llama, prompt)
        print(f"prompt {k} ({len(prompt)} ids): vLLM {got[:6]}... transformers {want[:6]}...")
        assert len(got) == STEPS and got == want, k
        changes += sum(a != b for a, b in zip(got, got[1:]))
    assert changes >= 5                       # not one token repeated: the test can tell


def _worst_logprob_gap(model, vllm_greedy):
    """Max |vLLM logprob - transformers log_softmax| over every prompt position's top-20 and
    each generated step's top-20 (a forward over prompt + generated ids; both normalise over
    the whole vocabulary), and how many were compared."""
    worst, compared = 0.0, 0
    for prompt, result in vllm_greedy:
        generated = list(result.outputs[0].token_ids)
        with torch.no_grad():
            ref = model(torch.tensor([prompt + generated])).logits[0].log_softmax(-1)
        for position, entries in enumerate(result.prompt_logprobs):
            for token, lp in (entries or {}).items():     # the first prompt token has none
                worst = max(worst, abs(lp.logprob - float(ref[position - 1, token])))
                compared += 1
        for step, entries in enumerate(result.outputs[0].logprobs):
            for token, lp in entries.items():
                worst = max(worst, abs(lp.logprob - float(ref[len(prompt) - 1 + step, token])))
                compared += 1
    return worst, compared


def test_vllm_logprobs_equal_transformers_log_softmax_within_1e4(hf_llama, vllm_greedy):
    worst, compared = _worst_logprob_gap(hf_llama, vllm_greedy)
    print(f"vLLM vs transformers: {compared} logprobs, max-abs-diff {worst:.2e}")
    positions = sum(len(p) - 1 + STEPS for p, _ in vllm_greedy)
    assert compared >= 20 * positions and worst <= 1e-4


def test_control_transformers_with_a_perturbed_mlp_no_longer_matches_vllm(hf_llama, vllm_greedy):
    weight = hf_llama.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)
        differing = sum(_hf_greedy(hf_llama, prompt) != list(result.outputs[0].token_ids)
                        for prompt, result in vllm_greedy[:2])     # the third one happens to hold
        worst, _ = _worst_logprob_gap(hf_llama, vllm_greedy)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    print(f"perturbed: {differing} of 2 greedy outputs differ; logprob gap {worst:.2e}")
    assert differing >= 1 and worst > 1e-2


# --- seeded RAS sampling through vLLM, as the talker stage requests it --------------------

SPOKEN = "One two three. The quick brown fox."     # 14 tokens: 28 to 280 speech tokens


def _talk(llm, tok, seed, text=SPOKEN):
    """GLMTTSTalkerStage.talk (its SamplingParams, its chunking) on the module's engine: the
    stage's engine host is replaced by one that runs the request on `llm` and hands back the
    ids one step at a time, as AsyncLLM does."""
    from vllm import TokensPrompt

    from tritontts.families.glm_tts.stages import GLMTTSTalkerStage

    stage = object.__new__(GLMTTSTalkerStage)
    stage.ids, stage.max_model_len = tok.ids, 1024
    raw: list[int] = []

    async def generate(prompt_ids, params, request_id, cancelled=lambda: False):
        out = llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, use_tqdm=False)[0]
        raw.extend(out.outputs[0].token_ids)
        for n in range(1, len(raw) + 1):
            yield raw[:n]

    stage.generate = generate
    text_ids = tok.encode(text)
    prompt = segment_prompt(tok.encode(REF_TEXT), list(range(100, 130)), text_ids, History(),
                            tok.ids.boa, tok.ids.ats)

    async def collect():
        return [(list(tokens), chunk) async for tokens, chunk in
                stage.talk(f"t-{seed}", prompt, len(text_ids), seed, dict(RAS_DEFAULTS))]

    return raw, asyncio.run(collect()), len(text_ids)


def test_seeded_ras_sampling_repeats_and_streams_end_with_eoa_after_min_tokens(llm, tok):
    ids = tok.ids
    (raw_a, chunks_a, text_len), (raw_b, _, _), (raw_c, chunks_c, _) = (
        _talk(llm, tok, 7), _talk(llm, tok, 7), _talk(llm, tok, 8))
    print(f"seed 7: {len(raw_a)} ids, seed 8: {len(raw_c)} ids; {text_len} text tokens")
    assert raw_a == raw_b                     # same seed, same tokens
    assert raw_a != raw_c                     # control: another seed
    min_tokens, max_tokens = token_bounds(text_len)
    for raw, chunks in ((raw_a, chunks_a), (raw_c, chunks_c)):
        assert raw[-1] == ids.eoa             # ended by <|user|>, not by max_tokens...
        assert min_tokens <= len(raw) - 1 < max_tokens       # ...and only after min_tokens
        assert all(ids.ats <= t < ids.ats + AUDIO_TOKENS for t in raw[:-1])   # audio only
        tokens, last = chunks[-1]
        assert last.last and tokens == [t - ids.ats for t in raw[:-1]]
        assert [c.tokens for _, c in chunks] == [e for e in (25, 75, 275, 475) if e < len(tokens)] + [len(tokens)]
