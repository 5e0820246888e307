"""Assemble upstream's AuK release (config.yaml, auk_base.safetensors or auk_flash.safetensors,
vae.safetensors, the Qwen2.5-Omni-3B thinker) into vLLM-Omni's layout (config.json model_type
auk, the thinker's shards and tokenizer, auk.safetensors, vae.safetensors). The stages serve
either layout; see tritontts/families/auk/assemble.py.

  .venv/bin/python build/auk_checkpoint.py UPSTREAM_DIR OUT_DIR [--copy]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritontts.families.auk.assemble import assemble  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("upstream")
    parser.add_argument("out")
    parser.add_argument("--copy", action="store_true", help="copy the files instead of linking them")
    args = parser.parse_args()
    print(assemble(args.upstream, args.out, args.copy))
