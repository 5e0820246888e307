"""Every stage whose config lets Triton batch it (max_batch_size > 1) computes a batch
together (GroupedStage or its own run_batch), runs it on a ChunkScheduler's workers
(decoupled, one response per request), talks through an engine that batches (EngineStage),
or says why it computes a batch's requests one after another (`one_by_one`); and every
GroupedStage is measured by some family's `batch_cases` (tritontts.benchmark.batching)."""
from __future__ import annotations

import importlib

import pytest

from tritontts.deploy.repository import STAGE_REPOSITORY, decoupled, read_config
from tritontts.families import FAMILIES
from tritontts.serving.stage import EngineStage, GroupedStage, Stage, StreamingStage

FOLDERS = sorted(d for d in STAGE_REPOSITORY.iterdir() if (d / "config.pbtxt").exists())


def stage_class(folder):
    config = read_config(folder / "config.pbtxt")
    module, name = config.parameters["stage"].string_value.split(":")
    return config, getattr(importlib.import_module(module), name)


def how_it_batches(config, cls) -> str | None:
    """How the stage computes a batch, or None if it would loop without a reason."""
    if issubclass(cls, EngineStage):
        return "engine"
    if issubclass(cls, GroupedStage):
        return "grouped"
    if not issubclass(cls, StreamingStage) and cls.run_batch is not Stage.run_batch:
        return "run_batch"
    if not issubclass(cls, StreamingStage) and decoupled(config):
        return "scheduled"
    return "one by one: " + cls.one_by_one if cls.one_by_one else None


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda d: d.name)
def test_a_stage_triton_batches_computes_the_batch_together_or_says_why_not(folder):
    config, cls = stage_class(folder)
    if config.max_batch_size <= 1:
        return
    assert how_it_batches(config, cls), (
        f"{folder.name} ({cls.__name__}): Triton batches it (max_batch_size {config.max_batch_size}) but "
        "it runs the batch one by one without a reason; make it a GroupedStage or set `one_by_one`")


def test_the_classification_tells_a_loop_without_a_reason_from_the_rest():
    """The negative control: a plain Stage in a non-decoupled model has no way to batch."""
    config, _ = stage_class(STAGE_REPOSITORY / "omnivoice_decoder")

    class Looping(Stage):
        pass

    class Explained(Stage):
        one_by_one = "a reason"

    assert how_it_batches(config, Looping) is None
    assert how_it_batches(config, Explained) == "one by one: a reason"


def test_every_grouped_stage_is_in_a_familys_batch_cases(random_checkpoints):
    grouped = {d.name for d in FOLDERS if issubclass(stage_class(d)[1], GroupedStage)}
    measured = set()
    for name, family in FAMILIES.items():
        if family.batch_cases:
            checkpoint = family.open_checkpoint(random_checkpoints[name])
            measured |= {case.stage for case in family.batch_cases(checkpoint)}
    assert measured == grouped, (grouped - measured, measured - grouped)
