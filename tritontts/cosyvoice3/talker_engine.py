"""The CosyVoice3 talker stage's engine: vLLM's AsyncLLM on its own asyncio loop thread
(the vllm_backend pattern), streaming speech tokens per request in hops for the flow stage."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from ..stage import InvalidRequest
from .checkpoint import CosyVoice3Checkpoint
from .streaming import HopSchedule, TokenChunk, TokenChunker
from .talker import (TALKER_META, TalkerVocab, convert_llm_checkpoint, load_talker_vocab,
                     ras_extra_args)


logger = logging.getLogger("tritontts.cosyvoice3.talker")


def ensure_talker_checkpoint(ckpt: CosyVoice3Checkpoint, cache_root: str | Path | None = None) -> Path:
    """The vLLM-native talker for this checkpoint, converted once and cached (keyed by the
    checkpoint's path and llm.pt's size and mtime)."""
    llm = ckpt.path("llm.pt")
    stat = llm.stat()
    key = hashlib.sha256(f"{llm.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    root = Path(cache_root or os.environ.get("TRITONTTS_CACHE", Path.home() / ".cache" / "tritontts"))
    out = root / "cosyvoice3-talker" / key
    if not (out / TALKER_META).is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        text_config = json.loads((ckpt.text_model_dir / "config.json").read_text())
        convert_llm_checkpoint(ckpt.state_dict("llm.pt"), text_config, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another instance converted it first
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass(frozen=True)
class TalkRequest:
    request_id: str
    prompt_ids: list[int]
    min_tokens: int
    max_tokens: int
    seed: int | None
    prompt_tokens: int       # length of the prompt speech tokens (aligns the first hop)


class TalkerEngine:
    def __init__(self, talker_dir: Path, sampling: dict, schedule: HopSchedule,
                 engine_args: dict | None = None):
        self.vocab: TalkerVocab = load_talker_vocab(talker_dir)
        self.sampling = sampling
        self.schedule = schedule
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="talker-loop", daemon=True)
        self._thread.start()
        # On vLLM's CPU backend gpu_memory_utilization is the share of RAM for weights + KV cache.
        args = dict(dtype="float32", max_model_len=4096, enable_prefix_caching=False,
                    enforce_eager=True, seed=0, gpu_memory_utilization=0.25)
        args.update(engine_args or {})
        self.max_model_len = int(args["max_model_len"])
        self.engine = self.submit(self._create(str(talker_dir), args)).result()

    async def _create(self, model: str, args: dict):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from .vllm_ras import RAS_LOGITS_PROCESSOR

        engine_args = AsyncEngineArgs(model=model, skip_tokenizer_init=True,
                                      logits_processors=[RAS_LOGITS_PROCESSOR], **args)
        return AsyncLLM.from_engine_args(engine_args)

    def submit(self, coro: Awaitable) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def talk(self, req: TalkRequest, on_chunk: Callable[[list[int], TokenChunk], None],
                   cancelled: Callable[[], bool] = lambda: False) -> int:
        """Generate; call on_chunk(speech_tokens_so_far, chunk) per hop and once finally.
        Returns the number of speech tokens generated."""
        from vllm import SamplingParams, TokensPrompt

        room = self.max_model_len - len(req.prompt_ids)
        if room <= req.min_tokens:
            raise InvalidRequest(f"the reference prompt and text need {len(req.prompt_ids)} of the "
                                 f"talker's {self.max_model_len} positions: use a shorter ref_audio")
        params = SamplingParams(
            temperature=1.0, top_p=1.0, top_k=0, seed=req.seed, detokenize=False,
            min_tokens=req.min_tokens, max_tokens=min(req.max_tokens, room),
            allowed_token_ids=self.vocab.allowed_ids, stop_token_ids=self.vocab.stop_ids,
            extra_args=ras_extra_args(self.vocab, self.sampling))
        chunker = TokenChunker(self.schedule, req.prompt_tokens)
        tokens: list[int] = []
        seen = 0
        stop = set(self.vocab.stop_ids)
        async for output in self.engine.generate(TokensPrompt(prompt_token_ids=req.prompt_ids),
                                                 params, req.request_id):
            if cancelled():
                await self.engine.abort(req.request_id)
                logger.info("talker request %s cancelled after %d tokens", req.request_id, len(tokens))
                raise asyncio.CancelledError("the client cancelled the request")
            ids = output.outputs[0].token_ids   # cumulative: convert only what is new
            tokens.extend(self.vocab.to_speech(t) for t in ids[seen:] if t not in stop)
            seen = len(ids)
            while (chunk := chunker.poll(len(tokens))) is not None:
                on_chunk(tokens, chunk)
        on_chunk(tokens, chunker.finish(len(tokens)))
        return len(tokens)

    def shutdown(self):
        try:
            self.engine.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
