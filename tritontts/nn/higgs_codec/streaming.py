"""Chunked (streaming) decoding: the decoder's reach, chunk windows, exact chunks."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from .config import HiggsCodecConfig
from .decoder import AcousticDecoder, HiggsCodecDecoder


def _decoder_reach(cfg: HiggsCodecConfig) -> tuple[int, int]:
    """(frames before, frames after) a frame whose codes can change that frame's samples.

    Walks the DAC decoder's convolutions back from one output sample to the span of input
    positions it reads, for every phase of a sample within its frame. The decoder runs
    its layers in the order they are registered, and every stride-1 conv in it is centred
    (padding = dilation * (kernel - 1) / 2), so its span contains the input position
    itself and a residual skip around it widens nothing. Snake, fc2 and the RVQ are per
    position. The span is an upper bound on the real reach (a zero tap would shorten
    it); tests measure that random weights reach exactly this far."""
    with torch.device("meta"):
        convs = [m for m in AcousticDecoder(cfg).modules()
                 if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    before = after = 0
    for phase in range(cfg.samples_per_frame):
        lo = hi = phase                       # one output sample of frame 0
        for conv in reversed(convs):
            (k,), (s,), (p,), (d,) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
            if isinstance(conv, nn.ConvTranspose1d):
                if d != 1:
                    raise ValueError("dilated transposed convs are not modelled")
                # y[n] = sum_m x[m] w[n + p - m*s] over 0 <= n + p - m*s < k
                lo, hi = -(-(lo + p - k + 1) // s), (hi + p) // s
            else:
                if s != 1 or 2 * p != d * (k - 1):
                    raise ValueError("only centred stride-1 convs are modelled")
                lo, hi = lo - p, hi - p + d * (k - 1)     # y[n] = sum_j x[n - p + j*d]
        before, after = max(before, -lo), max(after, hi)
    return before, after


def context_frames(cfg: HiggsCodecConfig) -> int:
    """How many frames on each side of a frame can change its samples: the decoder's
    receptive-field radius in frames, rounded up (the larger of its two sides). A chunk
    decoded with this many real frames of context on both sides (fewer only where the
    utterance itself ends) equals the same frames of a whole-utterance decode."""
    return max(_decoder_reach(cfg))


def chunk_window(start: int, stop: int, total: int, context: int) -> tuple[int, int, int, int]:
    """The window to decode for frames [start, stop) of an utterance of `total` frames
    known so far: (lo, hi, left, right), decode codes[..., lo:hi] with decode_chunk(...,
    left, right). Context is clipped at the utterance's edges, where the whole-utterance
    decode pads with zeros exactly as the window does. While streaming, `total` is the
    frames generated so far: a chunk is exact once total >= stop + context, or at the end."""
    if not 0 <= start < stop <= total or context < 0:
        raise ValueError(f"bad chunk [{start}, {stop}) of {total} frames, context {context}")
    lo, hi = max(0, start - context), min(total, stop + context)
    return lo, hi, start - lo, hi - stop


def _check_margins(width: int, left: int, right: int) -> None:
    if left < 0 or right < 0 or left + right >= width:
        raise ValueError(f"left {left} + right {right} context frames leave nothing of a "
                         f"{width}-frame window")


def decode_chunk(decoder: HiggsCodecDecoder, codes: Tensor, left: int, right: int) -> Tensor:
    """codes [B, Q, W], a window whose first `left` and last `right` frames are context
    -> audio [B, (W - left - right) * samples_per_frame] of the frames in between (every
    row has the same margins; decode_chunk_rows for per-row ones)."""
    if codes.ndim != 3:
        raise ValueError(f"expected codes [batch, quantizers, frames], got {tuple(codes.shape)}")
    width = codes.shape[-1]
    _check_margins(width, left, right)
    spf = decoder.cfg.samples_per_frame
    return decoder(codes)[:, left * spf:(width - right) * spf]


def decode_chunk_rows(decoder: HiggsCodecDecoder, codes: Tensor, lefts: Sequence[int],
                      rights: Sequence[int]) -> list[Tensor]:
    """decode_chunk with margins per row (windows of one width, batched in one decode):
    one 1-D audio tensor per row, as long as that row's kept frames."""
    if codes.ndim != 3 or not len(lefts) == len(rights) == codes.shape[0]:
        raise ValueError(f"expected codes [batch, quantizers, frames] and one left and right "
                         f"per row, got {tuple(codes.shape)}, {len(lefts)}, {len(rights)}")
    width = codes.shape[-1]
    for left, right in zip(lefts, rights):
        _check_margins(width, left, right)
    spf = decoder.cfg.samples_per_frame
    audio = decoder(codes)
    return [audio[row, left * spf:(width - right) * spf]
            for row, (left, right) in enumerate(zip(lefts, rights))]
