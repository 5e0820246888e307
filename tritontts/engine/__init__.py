"""vLLM engines inside stages: the talker stage (vLLM's engine core in the stage's process),
per-frame sub-models driven from vLLM's sampler (vllm_frames), RAS sampling. Imports no
family."""
