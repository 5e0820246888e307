"""vLLM engines inside stages: the talker stage (AsyncLLM or an in-process engine core),
per-frame sub-models driven from vLLM's sampler (vllm_frames), RAS sampling. Imports no
family."""
