"""The tritontts backend (tritontts/serving/triton_stage.py) on CPU with a stand-in pb_utils: how it
types outputs from the config, forwards stream metadata, numbers and finalizes streamed
chunks, maps errors, skips cancelled requests and sends engine responses off the loop.
Also the real stage classes whose logic used to be reachable only through a server:
piper's sentence look-ahead and the CosyVoice3 talker's segment loop."""
from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tritontts.serving.stage import EngineStage, Stage, StreamingStage
from tritontts.protocol import InvalidRequest
from tritontts.testing.pb_utils import FakeRequest, fake_pb_utils, model_args

REPO = Path(__file__).resolve().parent.parent
FINAL = 1


def write_config(tmp_path: Path, stage: str, *, decoupled: bool, inputs: str, outputs: str,
                 extra: str = "") -> Path:
    (tmp_path / "m" / "1").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "m" / "config.pbtxt"
    path.write_text(f'''name: "m"
backend: "tritontts"
max_batch_size: 4
{"model_transaction_policy { decoupled: true }" if decoupled else ""}
input [ {inputs} ]
output [ {outputs} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "stage" value: {{ string_value: "{__name__}:{stage}" }} }}
{extra}''')
    return path


def load(path: Path):
    from tritontts.serving.triton_stage import TritonPythonModel

    model = TritonPythonModel()
    model.initialize(model_args(path))
    return model


META_IN = ('{ name: "stream_id" data_type: TYPE_INT64 dims: [ 1 ] }, '
           '{ name: "chunk_index" data_type: TYPE_INT32 dims: [ 1 ] }, '
           '{ name: "is_final" data_type: TYPE_BOOL dims: [ 1 ] }')
META_OUT = META_IN


# --- one-response stages ------------------------------------------------------------------

class Doubler(Stage):
    def run(self, inputs):
        if inputs.scalar("x") < 0:
            raise InvalidRequest("x must be >= 0")
        if inputs.scalar("x") == 13:
            raise RuntimeError("unlucky")
        return {"y": inputs.flat("x") * 2}          # float64 here; the config says FP32


class Forgetful(Stage):
    def run(self, inputs):
        return {}


@pytest.fixture
def doubler(tmp_path):
    with fake_pb_utils():
        yield load(write_config(
            tmp_path, "Doubler", decoupled=False,
            inputs='{ name: "x" data_type: TYPE_FP64 dims: [ -1 ] }, ' + META_IN,
            outputs='{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }, ' + META_OUT))


def test_outputs_take_the_config_dtype_and_stream_metadata_passes_through(doubler):
    [response] = doubler.execute([FakeRequest(
        {"x": np.array([1.5, 2.0]), "stream_id": np.array([7], np.int64),
         "chunk_index": np.array([3], np.int32), "is_final": np.array([True])})])
    assert not response.has_error()
    y = response.output("y")
    assert y.dtype == np.float32 and y.shape == (1, 2) and y.tolist() == [[3.0, 4.0]]
    assert response.output("stream_id").tolist() == [[7]]
    assert response.output("chunk_index").tolist() == [[3]]
    assert response.output("is_final").tolist() == [[True]]


def test_invalid_request_is_tagged_for_http_400_and_other_errors_are_internal(doubler):
    meta = {"stream_id": np.array([1], np.int64), "chunk_index": np.array([0], np.int32),
            "is_final": np.array([True])}
    bad, broken = doubler.execute([FakeRequest({"x": np.array([-1.0]), **meta}),
                                   FakeRequest({"x": np.array([13.0]), **meta})])
    assert bad.error().message() == "[invalid_request] x must be >= 0"
    assert broken.error().message().startswith("internal error: RuntimeError('unlucky')")


def test_cancelled_request_is_skipped_with_a_cancelled_error(doubler):
    [response] = doubler.execute([FakeRequest({"x": np.array([1.0])}, cancelled=True)])
    assert response.error().message() == "cancelled"


def test_an_output_the_stage_did_not_produce_is_an_internal_error(tmp_path):
    with fake_pb_utils():
        model = load(write_config(tmp_path, "Forgetful", decoupled=False,
                                  inputs='{ name: "x" data_type: TYPE_FP64 dims: [ -1 ] }',
                                  outputs='{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }'))
        [response] = model.execute([FakeRequest({"x": np.array([1.0])})])
    assert "produced no 'y'" in response.error().message()


def test_a_streaming_stage_in_a_non_decoupled_model_is_refused_at_load(tmp_path):
    with fake_pb_utils(), pytest.raises(ValueError, match="decoupled: true"):
        load(write_config(tmp_path, "Sentences", decoupled=False,
                          inputs='{ name: "text" data_type: TYPE_STRING dims: [ 1 ] }',
                          outputs='{ name: "word" data_type: TYPE_STRING dims: [ 1 ] }'))


# --- streaming stages ---------------------------------------------------------------------

class Sentences(StreamingStage):
    """Yields one chunk per word and leaves is_final to the backend (look-ahead)."""

    def run(self, inputs):
        words = inputs.scalar("text").split()
        for i, word in enumerate(words):
            if word == "boom":
                raise RuntimeError("boom")
            yield {"word": word, "stream_id": 99}


@pytest.fixture
def sentences(tmp_path):
    with fake_pb_utils():
        yield load(write_config(
            tmp_path, "Sentences", decoupled=True,
            inputs='{ name: "text" data_type: TYPE_STRING dims: [ 1 ] }',
            outputs='{ name: "word" data_type: TYPE_STRING dims: [ 1 ] }, ' + META_OUT))


def test_streamed_chunks_are_numbered_and_only_the_last_is_final(sentences):
    request = FakeRequest({"text": "one two three"})
    assert sentences.execute([request]) is None
    responses = request.sender.responses
    assert [r.output("word")[0, 0] for r in responses] == [b"one", b"two", b"three"]
    assert [int(r.output("chunk_index")[0, 0]) for r in responses] == [0, 1, 2]
    assert [bool(r.output("is_final")[0, 0]) for r in responses] == [False, False, True]
    assert request.sender.flags == [0, 0, FINAL]


def test_a_stream_with_nothing_to_send_is_a_request_error(sentences):
    request = FakeRequest({"text": "   "})
    sentences.execute([request])
    [(response, flags, _)] = request.sender.sent
    assert flags == FINAL and response.error().message().startswith("[invalid_request] input has nothing")


def test_a_failure_mid_stream_ends_the_stream_with_an_error(sentences):
    request = FakeRequest({"text": "one two boom"})
    sentences.execute([request])
    responses = request.sender.responses
    assert [bool(r.has_error()) for r in responses] == [False, True]
    assert responses[0].output("is_final").tolist() == [[False]]
    assert request.sender.flags[-1] == FINAL and "boom" in responses[-1].error().message()


class Segments(StreamingStage):
    """Marks its last chunk final itself (as OmniVoice's prompt stage does) and stores a
    voice when asked for voice_features alone."""

    def run(self, inputs):
        words = inputs.scalar("text").split()
        for i, word in enumerate(words):
            yield {"word": word, "stream_id": 5, "is_final": i == len(words) - 1}

    def encode_voice(self, inputs):
        return b"features:" + inputs.scalar("text").encode()


@pytest.fixture
def segments(tmp_path):
    with fake_pb_utils():
        yield load(write_config(
            tmp_path, "Segments", decoupled=True,
            inputs='{ name: "text" data_type: TYPE_STRING dims: [ 1 ] }',
            outputs='{ name: "word" data_type: TYPE_STRING dims: [ 1 ] }, '
                    '{ name: "voice_features" data_type: TYPE_STRING dims: [ 1 ] }, ' + META_OUT))


def test_a_stream_that_marks_its_own_final_chunk_sends_nothing_after_it(segments):
    """Every request of a batch is streamed: nothing is sent after a stage's own final
    chunk (Triton's sender is closed by then, and the raise would fail the batch's other
    requests)."""
    requests = [FakeRequest({"text": "one two"}), FakeRequest({"text": "three"})]
    assert segments.execute(requests) is None
    for request, words in zip(requests, ([b"one", b"two"], [b"three"])):
        assert [r.output("word")[0, 0] for r in request.sender.responses] == words
        assert request.sender.flags[-1] == FINAL and not any(r.has_error() for r in request.sender.responses)


def test_a_decoupled_stage_asked_for_voice_features_alone_answers_once(segments):
    request = FakeRequest({"text": "ref"}, requested=["voice_features"])
    segments.execute([request])
    [(response, flags, _)] = request.sender.sent
    assert flags == FINAL and response.output("voice_features")[0, 0] == b"features:ref"


# --- batched one-response stages ------------------------------------------------------------

class BatchSum(Stage):
    """Adds every request's x to the batch's total: computed together, answered per request."""
    batches: list[int] = []

    def run_batch(self, batch):
        BatchSum.batches.append(len(batch))
        if any(inputs.scalar("x") < 0 for inputs in batch):
            return [InvalidRequest("x must be >= 0") if inputs.scalar("x") < 0 else
                    {"y": np.array([inputs.scalar("x")])} for inputs in batch]
        total = sum(float(inputs.scalar("x")) for inputs in batch)
        return [{"y": np.array([total])} for _ in batch]


def test_run_batch_gets_the_dynamic_batch_at_once_and_errors_stay_per_request(tmp_path):
    with fake_pb_utils():
        model = load(write_config(tmp_path, "BatchSum", decoupled=False,
                                  inputs='{ name: "x" data_type: TYPE_FP64 dims: [ 1 ] }',
                                  outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }'))
        BatchSum.batches.clear()
        a, b, cancelled = model.execute([FakeRequest({"x": np.array([1.0])}), FakeRequest({"x": np.array([2.0])}),
                                         FakeRequest({"x": np.array([5.0])}, cancelled=True)])
        assert BatchSum.batches == [2]       # the cancelled request never reached the stage
        assert a.output("y").tolist() == b.output("y").tolist() == [[3.0]]
        assert cancelled.error().message() == "cancelled"
        good, bad = model.execute([FakeRequest({"x": np.array([1.0])}), FakeRequest({"x": np.array([-1.0])})])
        assert good.output("y").tolist() == [[1.0]]
        assert bad.error().message() == "[invalid_request] x must be >= 0"


class InParts(Stage):
    """Computes a batch one request at a time, reporting each result ready as it goes, and
    notes what request 0's sender had received when request 1 was computed."""
    seen_before_second: list[int] = []
    senders: list = []

    def run_batch(self, batch, ready=None):
        results = []
        for index, inputs in enumerate(batch):
            if index == 1:
                InParts.seen_before_second.append(len(InParts.senders[0].sent))
            results.append({"y": np.array([inputs.scalar("x") * 10])})
            if ready is not None:
                ready(index, results[-1])
        return results


def test_a_decoupled_batched_stage_sends_each_result_when_ready_and_once(tmp_path):
    with fake_pb_utils():
        model = load(write_config(tmp_path, "InParts", decoupled=True,
                                  inputs='{ name: "x" data_type: TYPE_FP64 dims: [ 1 ] }',
                                  outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }'))
        assert model.scheduler is None
        requests = [FakeRequest({"x": np.array([1.0])}), FakeRequest({"x": np.array([2.0])})]
        InParts.senders, InParts.seen_before_second = [r.sender for r in requests], []
        assert model.execute(requests) is None
    assert InParts.seen_before_second == [1]     # request 0 answered before request 1 ran
    for request, want in zip(requests, (10.0, 20.0)):
        [(response, flags, _)] = request.sender.sent
        assert flags == FINAL and response.output("y").tolist() == [[want]]


# --- engine stages ------------------------------------------------------------------------

class Counter(EngineStage):
    """Counts to n on its own loop, marking the last chunk final itself."""
    closed: list[str] = []
    loop_threads: list[str] = []

    async def run(self, inputs):
        n = int(inputs.scalar("n"))
        try:
            for i in range(n):
                Counter.loop_threads.append(threading.current_thread().name)
                await asyncio.sleep(0)
                yield {"value": i, "is_final": i == n - 1}
        finally:
            Counter.closed.append(inputs.scalar("n"))


@pytest.fixture
def counter(tmp_path):
    with fake_pb_utils():
        model = load(write_config(
            tmp_path, "Counter", decoupled=True,
            inputs='{ name: "n" data_type: TYPE_INT32 dims: [ 1 ] }',
            outputs='{ name: "value" data_type: TYPE_INT32 dims: [ 1 ] }, '
                    '{ name: "chunk_index" data_type: TYPE_INT32 dims: [ 1 ] }, '
                    '{ name: "is_final" data_type: TYPE_BOOL dims: [ 1 ] }'))
        yield model
        model.finalize()


def test_engine_responses_are_sent_off_the_engine_loop_in_order(counter):
    requests = [FakeRequest({"n": np.array([3], np.int32)}), FakeRequest({"n": np.array([2], np.int32)})]
    counter.execute(requests)
    for request, n in zip(requests, (3, 2)):
        assert request.sender.done.wait(10)
        assert [int(r.output("value")[0, 0]) for r in request.sender.responses] == list(range(n))
        assert [int(r.output("chunk_index")[0, 0]) for r in request.sender.responses] == list(range(n))
        assert request.sender.flags == [0] * (n - 1) + [FINAL]
        senders = {thread for _, _, thread in request.sender.sent}
        assert senders == {"m-responses"} and not senders & set(Counter.loop_threads)


def test_a_cancelled_engine_request_stops_and_its_generator_is_closed(counter):
    request = FakeRequest({"n": np.array([1000], np.int32)})
    request.cancelled = True
    Counter.closed.clear()
    counter.execute([request])
    assert request.sender.done.wait(10)
    [(response, flags, _)] = request.sender.sent
    assert flags == FINAL and response.error().message() == "cancelled"
    deadline = threading.Event()
    for _ in range(100):
        if Counter.closed:
            break
        deadline.wait(0.05)
    assert Counter.closed == [1000]


# --- real stages: piper's sentence look-ahead ---------------------------------------------

@pytest.fixture(scope="module")
def piper_text():
    with fake_pb_utils():
        model = load(REPO / "model_repository" / "piper_text" / "config.pbtxt")
        yield model


def test_piper_text_sends_one_chunk_per_sentence_and_marks_only_the_last_final(piper_text):
    request = FakeRequest({"text": "One sentence. Another one! A third?", "voice": "",
                           "params": '{"seed": 3}'})
    piper_text.execute([request])
    responses = request.sender.responses
    assert [int(r.output("chunk_index")[0, 0]) for r in responses] == [0, 1, 2]
    assert [bool(r.output("is_final")[0, 0]) for r in responses] == [False, False, True]
    assert request.sender.flags == [0, 0, FINAL]
    assert {int(r.output("seed")[0, 0]) for r in responses} == {3}
    assert len({int(r.output("stream_id")[0, 0]) for r in responses}) == 1
    assert all(r.output("phoneme_ids").size > 3 for r in responses)


def test_piper_text_rejects_unknown_voice_and_parameter_with_400_messages(piper_text):
    for inputs, message in (({"voice": "nobody", "params": ""}, "unknown voice 'nobody'"),
                            ({"voice": "", "params": '{"bogus": 1}'}, "unknown parameter(s) ['bogus']")):
        request = FakeRequest({"text": "Hello.", **inputs})
        piper_text.execute([request])
        [(response, flags, _)] = request.sender.sent
        assert flags == FINAL
        assert response.error().message().startswith("[invalid_request]")
        assert message in response.error().message()


# --- real stages: the CosyVoice3 talker's segment loop ------------------------------------

class ScriptedEngine:
    """Stands in for vLLM: per request, the cumulative token ids after each step."""

    def __init__(self, steps_per_request: dict[str, list[list[int]]]):
        self.steps = steps_per_request
        self.calls: list[tuple[str, list[int], int, int, int]] = []


def scripted_talker(steps: dict[str, list[list[int]]], first_hop=2, max_hop=4, scale=2, lookahead=1):
    from tritontts.families.cosyvoice3.hops import HopSchedule
    from tritontts.families.cosyvoice3.stages import CosyVoice3TalkerStage
    from tritontts.families.cosyvoice3.talker import TalkerVocab

    talker = object.__new__(CosyVoice3TalkerStage)   # no engine, no checkpoint
    talker.vocab = TalkerVocab(speech_offset=100)
    talker.sampling = {"top_p": 0.8, "top_k": 25, "win_size": 10, "tau_r": 0.1}
    talker.settings = {"sampling_method": "ras"}   # the talker's model.json default
    talker.max_model_len = 4096
    talker.schedule = HopSchedule(first_hop, max_hop, scale, lookahead)
    talker.calls = []

    async def generate(prompt_ids, params, request_id, cancelled=lambda: False):
        talker.calls.append((request_id, list(prompt_ids), params.seed, params.min_tokens, params.max_tokens))
        for ids in steps[request_id]:
            yield ids
    talker.generate = generate
    return talker


def run_talker(talker, inputs) -> list[dict]:
    from tritontts.serving.stage import Inputs

    async def collect():
        return [chunk async for chunk in talker.run(Inputs(inputs))]
    return asyncio.run(collect())


def test_talker_speaks_segments_in_one_stream_with_only_the_last_chunk_final():
    speech = lambda *t: [100 + x for x in t]   # noqa: E731 - speech token -> merged vocab id
    stop = 100 + 6561 + 1
    # Segment 0: 7 tokens one per step, then a stop id; segment 1: 3 tokens at once.
    steps = {"42-0": [speech(*range(1, k + 1)) for k in range(1, 8)] + [speech(*range(1, 8)) + [stop]],
             "42-1": [speech(9, 8, 7)]}
    talker = scripted_talker(steps)
    chunks = run_talker(talker, {
        "stream_id": np.array([42]), "seed": np.array([5]),
        "prompt_ids": np.array([1, 2, 3, 4, 5]), "segment_lengths": np.array([3, 2]),
        "min_tokens": np.array([2, 2]), "max_tokens": np.array([30, 30]),
        "prompt_tokens": np.array([0, 0, 0, 0])})
    # Hops of 2 then 4 (4 prompt tokens: no padding of the first hop), 1 token of lookahead;
    # the stop id is not a speech token; each segment ends with the rest, flushed.
    got = [(list(c["speech_tokens"]), c["token_offset"], c["segment_end"], c["is_final"]) for c in chunks]
    assert got == [([1, 2, 3], 0, False, False),
                   ([1, 2, 3, 4, 5, 6, 7], 2, False, False),
                   ([1, 2, 3, 4, 5, 6, 7], 6, True, False),
                   ([9, 8, 7], 0, False, False),
                   ([9, 8, 7], 2, True, True)]
    assert [(rid, ids, seed, lo, hi) for rid, ids, seed, lo, hi in talker.calls] == [
        ("42-0", [1, 2, 3], 5, 2, 30), ("42-1", [4, 5], 6, 2, 30)]


def test_talker_refuses_a_prompt_that_fills_its_context_with_a_400():
    talker = scripted_talker({"1-0": [[100]]})
    talker.max_model_len = 4
    with pytest.raises(InvalidRequest, match="shorter ref_audio"):
        run_talker(talker, {"stream_id": np.array([1]), "seed": np.array([0]),
                            "prompt_ids": np.array([1, 2, 3]), "segment_lengths": np.array([3]),
                            "min_tokens": np.array([2]), "max_tokens": np.array([9]),
                            "prompt_tokens": np.array([1])})


# --- a one-response stage in a decoupled model: earliest chunk first, in order per stream --

class Slow(Stage):
    def run(self, inputs):
        import time

        time.sleep(0.05 if int(inputs.scalar("chunk_index")) == 0 else 0.0)
        return {"y": inputs.flat("x") + 1}


def test_a_decoupled_one_response_stage_releases_each_streams_chunks_in_order(tmp_path):
    with fake_pb_utils():
        model = load(write_config(
            tmp_path, "Slow", decoupled=True,
            inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }, ' + META_IN,
            outputs='{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }, ' + META_OUT))
        done = []
        requests = [FakeRequest({"x": np.array([float(i)], np.float32), "stream_id": np.array([5]),
                                 "chunk_index": np.array([i], np.int32), "is_final": np.array([i == 2])})
                    for i in range(3)]
        for r in requests:
            r.sender.send = (lambda r: lambda response=None, flags=0: done.append(
                (int(response.output("chunk_index")[0, 0]), flags)))(r)
        model.execute(requests)   # chunk 0 is the slowest: 1 and 2 must wait for it
        for _ in range(100):
            if len(done) == 3:
                break
            threading.Event().wait(0.02)
        model.finalize()
    assert done == [(0, FINAL), (1, FINAL), (2, FINAL)]


def test_a_kind_gpu_instance_gives_its_stage_the_cuda_device_triton_named():
    with fake_pb_utils():
        from tritontts.serving.triton_stage import instance_device

    assert instance_device({"model_instance_kind": "GPU", "model_instance_device_id": "1"}) == "cuda:1"
    assert instance_device({"model_instance_kind": "CPU", "model_instance_device_id": "0"}) == "cpu"
    assert instance_device({}) == "cpu"


def test_a_gpu_talker_instance_sees_only_its_gpu(monkeypatch):
    from tritontts.engine.vllm_talker import pin_engine_gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pin_engine_gpu("cpu")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    pin_engine_gpu("cuda:1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")       # Triton counts what it sees
    pin_engine_gpu("cuda:1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"


def test_a_stage_that_uses_torch_gets_the_configs_torch_threads_and_others_leave_them(tmp_path):
    import torch

    from tritontts.serving.stage import StageContext

    class Plain(Stage):
        pass

    class WithTorch(Stage):
        uses_torch = True

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        Plain(StageContext("plain", tmp_path, parameters={"torch_threads": "2"}))
        assert torch.get_num_threads() == 1
        WithTorch(StageContext("with_torch", tmp_path, parameters={"torch_threads": "2"}))
        assert torch.get_num_threads() == 2
        WithTorch(StageContext("default", tmp_path))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_frame_talker_stopping_at_its_first_frame_or_on_a_chunk_boundary_ends_with_an_empty_final_chunk():
    """FrameChunkTalkerStage's stream ends, without an engine: a first frame that is the end
    gives one final chunk that is all context (one zero frame: the codec stages answer it with
    no audio, so the response is valid and empty; it was a 500 in three families, then a 400);
    frames ending exactly on a chunk boundary end with a final window of context only; an
    engine that made no frame at all (it cannot) is a 400, not a crash."""
    import torch

    from tritontts.engine.vllm_talker import FrameChunkTalkerStage

    END = torch.full((3,), -1.0)

    class Talker(FrameChunkTalkerStage):
        def __init__(self, made):
            self.made, self.chunk_frames, self.first_chunk_frames = made, 25, 4
            self.left_context_frames, self.positioned = 25, True

        async def generate(self, prompt_ids, params, key, cancelled):
            for _ in range(len(self.made)):
                self.frames.append(self.made[len(self.frames)])
                yield [0]

        def is_end(self, frame) -> bool:
            return bool((frame == -1).all())

        def window_codes(self, frames):
            return frames.numpy()

    async def run(made, limit=100):
        talker = Talker(made)
        talker.frames = []
        return [chunk async for chunk in talker.frame_chunks([1], None, "k", talker.frames, limit, lambda: False)]

    with pytest.raises(InvalidRequest, match="made no frame"):
        asyncio.run(run([]))
    (only,) = asyncio.run(run([END]))
    assert bool(only["is_final"]) and only["codes"].shape[0] == only["left_context"] == 1
    assert not only["codes"].any()
    frames = [torch.full((3,), float(i)) for i in range(29)]       # 4 + 25: a chunk boundary
    for made, limit in ((frames + [END], 100), (frames + frames[:3], 29)):   # a stop, or the budget
        chunks = asyncio.run(run(made, limit))
        assert [bool(c["is_final"]) for c in chunks] == [False, False, True]
        last = chunks[-1]
        assert last["left_context"] == last["codes"].shape[0] == 25 and last["first_frame"] == 4
    past = asyncio.run(run(frames + frames[:1] + [END]))            # one frame past the boundary
    assert [c["codes"].shape[0] - c["left_context"] for c in past] == [4, 25, 1]


SHM_FULL = ("Failed to increase the shared memory pool size for key 'triton_tritontts_backend_shm_region_x' "
            "to 1048576 bytes. Error: No space left on device")


def shm_full_once(request):
    """The request's sender fails its first response as Triton's does when /dev/shm cannot
    grow the stage's region (the message as a real server gave it with a 4.2 MiB tmpfs over
    /dev/shm and a long sentence)."""
    real, failed = request.sender.send, []

    def send(response=None, flags=0):
        if not failed and response is not None and not response.has_error():
            failed.append(True)
            raise RuntimeError(SHM_FULL)
        real(response, flags)

    request.sender.send = send
    return request


def test_a_response_that_does_not_fit_shared_memory_ends_its_request_with_a_503_and_the_worker_goes_on(tmp_path):
    """A decoupled one-response stage (the chunk scheduler's workers): the failed send
    once killed the worker thread, and the request (and every later one) waited forever."""
    with fake_pb_utils():
        model = load(write_config(
            tmp_path, "Slow", decoupled=True,
            inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }, ' + META_IN,
            outputs='{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }, ' + META_OUT))

        def request(stream: int) -> FakeRequest:
            return FakeRequest({"x": np.array([1.0], np.float32), "stream_id": np.array([stream]),
                                "chunk_index": np.array([0], np.int32), "is_final": np.array([True])})

        first, second = shm_full_once(request(1)), request(2)
        model.execute([first])
        assert first.sender.done.wait(5), "the request got no end"
        model.execute([second])
        assert second.sender.done.wait(5), "the worker did not go on"
        model.finalize()
    [(error, flags, _)] = first.sender.sent
    assert flags == FINAL and error.error().message().startswith("[unavailable] m could not send its response")
    assert "/dev/shm" in error.error().message() and "No space left" in error.error().message()
    assert not second.sender.responses[0].has_error()


def test_a_stream_whose_chunk_does_not_fit_shared_memory_ends_with_a_503_and_sends_nothing_after(sentences):
    request = shm_full_once(FakeRequest({"text": "one two three"}))
    sentences.execute([request])
    [(error, flags, _)] = request.sender.sent
    assert flags == FINAL and error.error().message().startswith("[unavailable]")


def test_a_503_stage_error_reaches_the_client_as_unavailable_with_the_stages_reason():
    from frontend.triton_client import TritonUnavailable, _classify

    exc = _classify("in ensemble 'piper': [unavailable] piper_vits could not send its response: /dev/shm")
    assert isinstance(exc, TritonUnavailable) and str(exc) == "piper_vits could not send its response: /dev/shm"
