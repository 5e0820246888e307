"""/dev/shm against what a server's stage processes take (tritontts/deploy/shared_memory.py),
without starting one: the stage count from the committed configs, the refusal and warning
lines. The launch refused for real, with a small tmpfs: tests/server/test_small_dev_shm.py."""
from __future__ import annotations

from tritontts.deploy.shared_memory import MIB, SharedMemoryNeed, stub_count
from tritontts.deploy.tritonserver import MODEL_REPOSITORIES, flag_values


def test_the_stage_processes_counted_are_each_stages_instances_with_ensembles_expanded():
    # piper: piper_text (2 instances) and piper_vits (1); the cancel model 1.
    assert stub_count(["piper"], MODEL_REPOSITORIES) == 3
    assert stub_count(["piper", "tritontts_cancel"], MODEL_REPOSITORIES) == 4
    assert stub_count(["piper_vits"], MODEL_REPOSITORIES) == 1
    assert stub_count(["no_such_model"], MODEL_REPOSITORIES) == 0


def test_too_little_to_start_is_a_refusal_with_the_numbers_and_enough_to_start_only_a_warning():
    short = SharedMemoryNeed(stubs=4, free_bytes=2 * MIB)
    assert short.refusal().startswith("/dev/shm has 2.0 MiB free, but the 4 stage processes of this server "
                                      "need 4 MiB to start")
    assert "--shm-size=64m" in short.refusal() and short.warning() is None
    tight = SharedMemoryNeed(stubs=4, free_bytes=5 * MIB)
    assert tight.refusal() is None and "may be answered 503" in tight.warning()
    roomy = SharedMemoryNeed(stubs=4, free_bytes=64 * MIB)
    assert roomy.refusal() is None and roomy.warning() is None


def test_the_pod_launcher_reads_the_models_and_repositories_of_a_tritonserver_command_line():
    args = ["--model-repository=/a", "--model-repository", "/b", "--load-model", "piper", "--load-model=x"]
    assert flag_values(args, "--model-repository") == ["/a", "/b"]
    assert flag_values(args, "--load-model") == ["piper", "x"]
