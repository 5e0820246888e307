"""`tritontts serve MODEL ...`: a vLLM-Omni user's command line, resolved into this project's
launcher (frontend/__main__.py): MODEL to a checkpoint folder and its family (resolve.py),
vLLM-Omni's serve flags and variables to ours (vllm_omni.py)."""
