"""Qwen3-TTS's PyTorch networks with random weights, for the GPU check's PyTorch tier
(Family.torch_networks; tritontts.benchmark.gpu_torch): Code2Wav's two networks, the code
predictor's per-frame loop (what each talker step runs after the backbone) and, at tiny
size, the talker backbone (vLLM runs it at released size)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from ...nn.runtime import Axis, Graph, TensorSpec
from .checkpoint import parse_config
from .code2wav import Code2WavConfig, Qwen3TTSCode2Wav, code2wav_graphs
from .random_checkpoint import SPECIAL_IDS, SPECIAL_TOKENS, _config, speech_tokenizer_config
from .talker import Qwen3TTSTalker, greedy, predict_frame


class CodePredictorFrame(nn.Module):
    """One frame of the code predictor, greedy: the talker's hidden state and code 0's
    embedding [B, H] -> codes 1..G-1 [B, G-1] (what predict_codes runs per talker step)."""

    def __init__(self, talker: Qwen3TTSTalker) -> None:
        super().__init__()
        self.predictor = talker.code_predictor

    def forward(self, past_hidden: Tensor, code0_embeds: Tensor) -> Tensor:
        code0 = torch.zeros(past_hidden.shape[0], dtype=torch.long, device=past_hidden.device)
        return predict_frame(self.predictor, past_hidden, code0, code0_embeds, greedy)[:, 1:]


class TalkerBackbone(nn.Module):
    def __init__(self, talker: Qwen3TTSTalker) -> None:
        super().__init__()
        self.talker = talker

    def forward(self, embeds: Tensor) -> Tensor:
        return self.talker(embeds)


def torch_networks(size: str) -> list[Graph]:
    checkpoint_size = "tiny" if size == "tiny" else "1.7b"
    special = {token: index for index, token in enumerate(SPECIAL_TOKENS)} | {"assistant": len(SPECIAL_TOKENS)}
    assert set(SPECIAL_IDS.values()) <= set(special)
    config = parse_config(_config("custom_voice", checkpoint_size, special), Path("config.json"))
    codec_config = speech_tokenizer_config(checkpoint_size)["decoder_config"]
    codec = Qwen3TTSCode2Wav(Code2WavConfig.from_dict(codec_config)).eval()
    talker = Qwen3TTSTalker(config).eval()
    hidden = config.talker.hidden_size
    graphs = [*code2wav_graphs(codec), Graph(
        name="qwen3_tts_code_predictor_frame", module=CodePredictorFrame(talker),
        inputs=(TensorSpec("past_hidden", torch.float32, ("batch", hidden)),
                TensorSpec("code0_embeds", torch.float32, ("batch", hidden))),
        outputs=("codes",), axes={"batch": Axis(1, 1, 64)})]
    if size == "tiny":
        graphs.append(Graph(
            name="qwen3_tts_talker_backbone", module=TalkerBackbone(talker),
            inputs=(TensorSpec("embeds", torch.float32, ("batch", "tokens", hidden)),),
            outputs=("hidden",), axes={"batch": Axis(1, 1, 64), "tokens": Axis(1, 32, 4096)}))
    return graphs
