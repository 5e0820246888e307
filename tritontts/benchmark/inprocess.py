"""A family's ensemble run in this process, with no server: the same stage models
(model_repository/*/config.pbtxt hosted by the same tritontts backend code,
tritontts/serving/triton_stage.py, over the stand-in pb_utils), chained the way the ensemble's steps
map tensors. It is the baseline "serving overhead" is measured against: what the stage code
costs when nothing carries its tensors over gRPC, HTTP or Triton's scheduler.

What it leaves out of Triton on purpose (and so does not measure): dynamic batching (each
execute gets one request, as Triton does at concurrency 1) and the stub's shared-memory IPC.
Every stage instance still gets a thread of its own, as Triton gives each model instance.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..family import Family
from ..deploy.repository import ENSEMBLE_REPOSITORY, STAGE_REPOSITORY, ensemble_path, read_config
from ..protocol import AUDIO, IS_FINAL, SAMPLE_RATE


@dataclass
class Timeline:
    """One request as the in-process caller saw it (seconds from the call)."""
    pieces: list[tuple[float, float]] = field(default_factory=list)   # (arrival, audio seconds)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _Sender:
    """Stands in for a request's response sender: hands each response to the chain."""

    def __init__(self, on_response):
        self.on_response = on_response

    def send(self, response=None, flags: int = 0) -> None:
        if response is not None:
            self.on_response(response)


class _StageHost:
    """A stage model's instances, each with a thread calling execute() one request at a time."""

    def __init__(self, name: str, repository: Path):
        from ..testing.pb_utils import model_args
        from ..serving.triton_stage import TritonPythonModel

        config = repository / name / "config.pbtxt"
        count = sum(g.count or 1 for g in read_config(config).instance_group) or 1
        self.name = name
        self.queue: queue.Queue = queue.Queue()
        self.models = []
        for _ in range(count):
            model = TritonPythonModel()
            model.initialize(model_args(config))
            self.models.append(model)
        self.threads = [threading.Thread(target=self._serve, args=(m,), daemon=True,
                                         name=f"{name}-instance{i}")
                        for i, m in enumerate(self.models)]
        for t in self.threads:
            t.start()

    def _serve(self, model) -> None:
        while (request := self.queue.get()) is not None:
            responses = model.execute([request])
            for response in responses or ():       # a non-decoupled model returns them
                request.sender.send(response, 1)

    def close(self) -> None:
        for _ in self.threads:
            self.queue.put(None)
        for t in self.threads:
            t.join(timeout=30)
        for model in self.models:
            model.finalize()


class InProcessEnsemble:
    """`family`'s ensemble in this process; `synthesize` streams like the served one."""

    def __init__(self, family: Family, checkpoint: Path | None,
                 stages: Path = STAGE_REPOSITORY, ensembles: Path = ENSEMBLE_REPOSITORY):
        from ..testing.pb_utils import fake_pb_utils

        if checkpoint is not None:     # the stages read it as the launcher hands it to them
            os.environ[family.checkpoint_env] = str(checkpoint)
        self.family = family
        self._pb_utils = fake_pb_utils()
        self._pb_utils.__enter__()
        config = read_config(ensemble_path(family, ensembles))
        self.steps = [(s.model_name, dict(s.input_map), dict(s.output_map))
                      for s in config.ensemble_scheduling.step]
        self.hosts = {}
        try:
            for model, _, _ in self.steps:
                self.hosts[model] = _StageHost(model, stages)
        except BaseException:
            self.close()
            raise
        self._ids = iter(range(1, 1 << 62))

    def synthesize(self, text: str, params: str = "", voice: str = "",
                   timeout: float = 600.0) -> Timeline:
        """Run one request through every stage; returns when its last chunk arrived."""
        from ..testing.pb_utils import FakeRequest

        timeline = Timeline()
        request_id = f"inprocess-{next(self._ids)}"
        start = time.perf_counter()
        last = len(self.steps) - 1

        def submit(step: int, tensors: dict[str, np.ndarray]) -> None:
            model, input_map, output_map = self.steps[step]
            request = FakeRequest({name: tensors[source] for name, source in input_map.items()
                                   if source in tensors},
                                  requested=list(output_map), request_id=request_id)
            request.sender = _Sender(lambda response: arrived(step, tensors, response))
            self.hosts[model].queue.put(request)

        def arrived(step: int, tensors: dict[str, np.ndarray], response) -> None:
            if timeline.done.is_set():
                return
            if response.has_error():
                timeline.error = response.error().message()
                timeline.done.set()
                return
            _, _, output_map = self.steps[step]
            produced = {output_map[t.name()]: t.as_numpy()[0] for t in response.output_tensors
                        if t.name() in output_map}
            if step < last:
                submit(step + 1, {**tensors, **produced})
                return
            audio = response.output(AUDIO)[0]
            rate = int(np.asarray(response.output(SAMPLE_RATE)).reshape(-1)[0])
            timeline.pieces.append((time.perf_counter() - start, audio.size / rate))
            if bool(np.asarray(response.output(IS_FINAL)).reshape(-1)[0]):
                timeline.done.set()

        submit(0, {"text": np.array([text.encode()], dtype=np.object_),
                   "voice": np.array([voice.encode()], dtype=np.object_),
                   "params": np.array([params.encode()], dtype=np.object_)})
        if not timeline.done.wait(timeout):
            timeline.error = f"no final chunk within {timeout:g} s"
        return timeline

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()
        self.hosts = {}
        if self._pb_utils is not None:
            self._pb_utils.__exit__(None, None, None)
            self._pb_utils = None
