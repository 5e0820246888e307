// AudioWorklet processors of the demo page (frontend/demo_page/demo.js loads this
// module). The audio context runs at the stream's own sample rate, so samples are played as
// they came: no resampling, nothing inserted between two chunks.
//
// "pcm-player": plays 16-bit mono PCM pushed to it (port messages: {samples: Int16Array},
// then {end: true}) back to back, from the first chunk on. Counts what it played (and an
// FNV-1a hash of those samples, which the page's tests compare with the downloaded file),
// and the render quanta it had to fill with silence because the next chunk had not come
// yet (underruns: the stream slower than real time; never silence between queued chunks).
// "pcm-recorder": hands its input's samples to the page (a reference recording).

const FNV_OFFSET = 0x811c9dc5, FNV_PRIME = 0x01000193;

class PcmPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = [];          // Int16Array pieces not yet played
    this.offset = 0;          // into queue[0]
    this.played = 0;
    this.hash = FNV_OFFSET;
    this.underruns = 0;
    this.ended = false;
    this.drained = false;
    this.started = false;
    this.lastReport = 0;
    this.port.onmessage = (event) => {
      const message = event.data;
      if (message.samples) {
        this.queue.push(message.samples);
        this.started = true;
      }
      if (message.end) this.ended = true;
    };
  }

  report(kind) {
    this.port.postMessage({type: kind, played: this.played, hash: this.hash >>> 0,
                           underruns: this.underruns});
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    while (i < out.length && this.queue.length) {
      const piece = this.queue[0];
      const n = Math.min(out.length - i, piece.length - this.offset);
      for (let k = 0; k < n; k++) {
        const s = piece[this.offset + k];
        out[i + k] = s / 32768;
        const u = s & 0xffff;
        this.hash = Math.imul(this.hash ^ (u & 0xff), FNV_PRIME);
        this.hash = Math.imul(this.hash ^ (u >>> 8), FNV_PRIME);
      }
      i += n;
      this.offset += n;
      this.played += n;
      if (this.offset === piece.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    if (i < out.length) {
      out.fill(0, i);
      if (this.started && !this.ended) this.underruns += 1;
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (this.ended && !this.queue.length && !this.drained) {
      this.drained = true;
      this.report("drained");
    } else if (currentTime - this.lastReport > 0.1) {
      this.lastReport = currentTime;
      this.report("progress");
    }
    return !this.drained;
  }
}

class PcmRecorder extends AudioWorkletProcessor {
  process(inputs) {
    const input = inputs[0];
    if (input && input[0]) this.port.postMessage(input[0].slice());
    return true;
  }
}

registerProcessor("pcm-player", PcmPlayer);
registerProcessor("pcm-recorder", PcmRecorder);
