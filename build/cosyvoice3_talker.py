"""Convert a CosyVoice3 checkpoint's llm.pt into a Qwen2ForCausalLM checkpoint vLLM serves
natively (speech rows appended to the vocabulary; see tritontts/families/cosyvoice3/talker.py).

The talker stage does this itself on first start and caches the result; run this to do it
ahead of time (e.g. in an image build) or to inspect the converted model:

  .venv/bin/python build/cosyvoice3_talker.py CHECKPOINT_DIR [--cache DIR]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritontts.families.cosyvoice3.checkpoint import open_checkpoint  # noqa: E402
from tritontts.families.cosyvoice3.talker import ensure_talker_checkpoint  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--cache", help="cache root (default: $TRITONTTS_CACHE or ~/.cache/tritontts)")
    args = parser.parse_args()
    print(ensure_talker_checkpoint(open_checkpoint(args.checkpoint), args.cache))
