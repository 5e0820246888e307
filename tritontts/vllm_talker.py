"""The engine host every talker shares: vLLM's AsyncLLM on the stage's own asyncio loop
(Triton's vllm_backend shape). A talker folder is config.pbtxt + 1/model.json:

  {"engine_args": {...},   vLLM AsyncEngineArgs, as-is (the only place they are set)
   ...}                    the family's own talker settings (e.g. CosyVoice3's "hops")

A family's talker subclasses VllmTalkerStage: it names the model folder vLLM loads
(`model_path`), adds what the engine needs beyond model.json (`engine_extras`, e.g. logits
processors) and implements `run` with `generate`.
"""
from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Callable

from .stage import EngineStage, StageContext

logger = logging.getLogger("tritontts.talker")


class TalkerCancelled(Exception):
    """The client went away; the engine request was aborted."""


class VllmTalkerStage(EngineStage):
    def __init__(self, context: StageContext):
        super().__init__(context)
        self.settings = context.settings("model.json")
        engine_args = dict(self.settings["engine_args"])
        # On vLLM's CPU backend gpu_memory_utilization is the share of RAM for weights + KV.
        self.max_model_len = int(engine_args["max_model_len"])
        self.engine = self.submit(self._create(self.model_path(),
                                               {**engine_args, **self.engine_extras()})).result()

    def model_path(self) -> str:
        raise NotImplementedError

    def engine_extras(self) -> dict[str, Any]:
        return {}

    async def _create(self, model: str, args: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **args))

    async def generate(self, prompt_ids: list[int], sampling_params, request_id: str,
                       cancelled: Callable[[], bool] = lambda: False) -> AsyncIterator[list[int]]:
        """The token ids generated so far, after each engine step. A cancelled client, or a
        consumer that stops early, aborts the engine request."""
        from vllm import TokensPrompt

        finished = False
        try:
            async for output in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids),
                                                     sampling_params, request_id):
                if cancelled():
                    logger.info("talker request %s cancelled", request_id)
                    raise TalkerCancelled("the client cancelled the request")
                yield output.outputs[0].token_ids
                finished = output.finished
        finally:
            if not finished:
                await self.engine.abort(request_id)

    def close(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            super().close()
