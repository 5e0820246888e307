"""Word timestamps: the words a text speaks (words.py) and a forced aligner that places them
on the audio that speaks them (whisper.py). Family-free: any family's delivered audio and
its request text go in, `{word, start_ms, end_ms}` in that audio's timeline come out (the
field names vLLM-Omni's speech API uses)."""
