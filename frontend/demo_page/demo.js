// The demo page: a form built from the selected model's description (GET /v1/audio/models),
// speech streamed as raw PCM (POST /v1/audio/speech, stream_format audio) into a gapless
// player that starts on the first chunk, and the whole audio offered as a WAV download.
// Served by the front at /demo, and by tritontts-demo for a front elsewhere (same origin
// either way: the page calls the API relative to itself, under ../v1/).
"use strict";

const API = new URL("../", location.href);
const $ = (id) => document.getElementById(id);
const state = {models: [], uploaded: [], model: null, values: {}, run: null};
// What the last Generate did, for people and for the page's browser tests.
window.tritonttsDemo = {last: null, state};

function headers(json) {
  const h = json ? {"Content-Type": "application/json"} : {};
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function getJSON(path) {
  const r = await fetch(new URL(path, API), {headers: headers(false)});
  if (!r.ok) throw await frontError(r);
  return r.json();
}

async function frontError(response) {
  let message = response.statusText, param = null;
  try {
    const body = await response.json();
    if (body.error) { message = body.error.message; param = body.error.param || null; }
  } catch (_) { /* not the front's JSON: keep the status text */ }
  const error = new Error(message);
  error.status = response.status;
  error.param = param;
  return error;
}

// --- the form -----------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k in node && typeof v !== "string") node[k] = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function fieldWidget(field) {
  const id = "field-" + field.name;
  const common = {id, "data-field": field.name};
  switch (field.kind) {
    case "long_text":
      return el("textarea", {...common, rows: "3"});
    case "integer":
      return el("input", {...common, type: "number", step: "1"});
    case "number":
      return el("input", {...common, type: "number", step: "any"});
    case "boolean":
      return el("select", common, el("option", {value: ""}, "(the model's default)"),
                el("option", {value: "true"}, "true"), el("option", {value: "false"}, "false"));
    case "choice":
      return el("select", common, el("option", {value: ""}, "(the model's default)"),
                ...field.choices.map((c) => el("option", {value: c}, c)));
    case "audio":
      return audioWidget(field, common);
    default:          // text, json
      return el("input", {...common, type: "text",
                          placeholder: field.kind === "json" ? "JSON, e.g. [0, 0.5, 1]" : ""});
  }
}

function audioWidget(field, common) {
  const file = el("input", {id: common.id + "-file", type: "file", accept: "audio/*"});
  const record = el("button", {type: "button", class: "secondary", id: common.id + "-record"}, "Record");
  const clear = el("button", {type: "button", class: "secondary", id: common.id + "-clear"}, "Clear");
  const preview = el("audio", {controls: true, id: common.id + "-preview"});
  const box = el("div", {...common, class: "audio-field"}, file, record, clear, preview);
  const set = (dataUrl, what) => {
    state.values[field.name] = dataUrl;
    preview.src = dataUrl || "";
    box.dataset.loaded = dataUrl ? what : "";
  };
  file.addEventListener("change", () => {
    const chosen = file.files[0];
    if (!chosen) return set(null, "");
    const reader = new FileReader();
    reader.onload = () => set(reader.result, chosen.name);
    reader.readAsDataURL(chosen);
  });
  clear.addEventListener("click", () => { file.value = ""; set(null, ""); });
  let recording = null;
  record.addEventListener("click", async () => {
    if (recording) {
      const wav = await recording.stop();
      recording = null;
      record.textContent = "Record";
      set(await blobDataUrl(wav), "recording");
      return;
    }
    try {
      recording = await startRecording();
      record.textContent = "Stop recording";
    } catch (error) {
      showError({message: "cannot record: " + error.message, param: field.name});
    }
  });
  return box;
}

function blobDataUrl(blob) {
  return new Promise((resolve) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.readAsDataURL(blob);
  });
}

async function startRecording() {
  const stream = await navigator.mediaDevices.getUserMedia({audio: true});
  const context = new AudioContext();
  await context.audioWorklet.addModule("pcm-player.js");
  const source = context.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(context, "pcm-recorder");
  const pieces = [];
  node.port.onmessage = (event) => pieces.push(event.data);
  source.connect(node);
  return {
    async stop() {
      source.disconnect();
      stream.getTracks().forEach((t) => t.stop());
      await context.close();
      const total = pieces.reduce((n, p) => n + p.length, 0);
      const pcm = new Int16Array(total);
      let at = 0;
      for (const p of pieces) {
        for (let i = 0; i < p.length; i++) pcm[at + i] = Math.max(-32768, Math.min(32767, Math.round(p[i] * 32767)));
        at += p.length;
      }
      return wavBlob([pcm], context.sampleRate);
    },
  };
}

function renderModel() {
  const model = state.models.find((m) => m.id === $("model").value) || state.models[0];
  state.model = model;
  state.values = {};
  clearError();
  const voices = [...model.voices];
  for (const v of state.uploaded) {
    if (v.model === model.id && !voices.includes(v.name)) voices.push(v.name);
  }
  $("voice").replaceChildren(...voices.map((v) => el("option", {value: v}, v)));
  const uploads = model.uploads_voices ? " Uploaded voices (POST /v1/audio/voices) are in the voice list." : "";
  $("model-info").textContent = `${model.description}. ${model.sample_rate} Hz` +
      (model.ready ? "" : " (not ready yet)") + "." + uploads;
  $("input-note").textContent = model.input_required ? "" : "(may be empty: the instructions can carry the whole request)";
  $("input").closest("label").classList.toggle("required", model.input_required);
  const main = [], advanced = [];
  for (const field of model.fields) {
    const label = el("label", {class: "field" + (field.required ? " required" : ""), "data-for": field.name},
                     el("span", {class: "title"}, field.name.replaceAll("_", " ")));
    label.append(el("small", {}, hint(field)), fieldWidget(field));
    (field.advanced ? advanced : main).push(label);
  }
  $("fields").replaceChildren(...main);
  $("advanced").replaceChildren(...advanced);
  $("advanced-box").hidden = !advanced.length;
}

function hint(field) {
  let text = field.description;
  if (field.unless_uploaded_voice) text += " (or choose an uploaded voice)";
  if (field.required_with) text += ` (required with ${field.required_with})`;
  return text;
}

function requestBody() {
  const model = state.model;
  const body = {model: model.id, input: $("input").value, voice: $("voice").value || "default",
                response_format: "pcm", stream_format: "audio"};
  for (const field of model.fields) {
    let value;
    if (field.kind === "audio") {
      value = state.values[field.name];
    } else {
      const raw = $("field-" + field.name).value.trim();
      if (raw === "") continue;
      if (field.kind === "integer" || field.kind === "number") value = Number(raw);
      else if (field.kind === "boolean") value = raw === "true";
      else if (field.kind === "json") {
        try { value = JSON.parse(raw); } catch (_) {
          throw Object.assign(new Error(`${field.name} is not valid JSON`), {param: field.name});
        }
      } else value = raw;
    }
    if (value !== undefined && value !== null) body[field.name] = value;
  }
  return body;
}

// --- errors -------------------------------------------------------------------------------

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
  delete $("error").dataset.param;
  document.querySelectorAll(".invalid").forEach((n) => n.classList.remove("invalid"));
}

function showError(error) {
  const box = $("error");
  const where = error.param ? ` (field: ${error.param})` : "";
  box.textContent = (error.status ? `${error.status}: ` : "") + error.message + where;
  box.dataset.param = error.param || "";
  box.hidden = false;
  const target = error.param && document.querySelector(`[data-field="${CSS.escape(error.param)}"]`);
  if (target) {
    target.classList.add("invalid");
    const details = target.closest("details");
    if (details) details.open = true;
    target.scrollIntoView({block: "center"});
  }
}

// --- playing ------------------------------------------------------------------------------

// A player at the stream's rate: the AudioWorklet (a secure context: https or localhost),
// else AudioBufferSourceNodes scheduled back to back (sample-exact too, on the main thread).
class StreamPlayer {
  static async open(rate) {
    const context = new AudioContext({sampleRate: rate, latencyHint: "interactive"});
    const player = new StreamPlayer(context);
    if (context.audioWorklet) {
      await context.audioWorklet.addModule("pcm-player.js");
      player.node = new AudioWorkletNode(context, "pcm-player", {outputChannelCount: [1]});
      player.node.connect(context.destination);
      player.node.port.onmessage = (event) => player.onReport(event.data);
    }
    await context.resume();
    return player;
  }

  constructor(context) {
    this.context = context;
    this.node = null;
    this.next = 0;
    this.report = {played: 0, hash: null, underruns: 0, drained: false};
    this.drained = new Promise((resolve) => { this.resolveDrained = resolve; });
  }

  onReport(message) {
    Object.assign(this.report, {played: message.played, hash: message.hash, underruns: message.underruns});
    if (message.type === "drained") {
      this.report.drained = true;
      this.resolveDrained();
    }
  }

  push(samples) {
    if (this.node) {
      this.node.port.postMessage({samples}, [samples.buffer]);
      return;
    }
    const buffer = this.context.createBuffer(1, samples.length, this.context.sampleRate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const now = this.context.currentTime;
    if (this.next < now) {
      if (this.next > 0) this.report.underruns += 1;
      this.next = now + 0.02;
    }
    source.start(this.next);
    this.next += samples.length / this.context.sampleRate;
    this.report.played += samples.length;
    this.last = source;
  }

  end() {
    if (this.node) this.node.port.postMessage({end: true});
    else if (this.last) this.last.onended = () => { this.report.drained = true; this.resolveDrained(); };
    else { this.report.drained = true; this.resolveDrained(); }
  }

  async close() {
    if (this.context.state !== "closed") await this.context.close();
  }
}

function fnv1a(pcm) {
  let hash = 0x811c9dc5;
  for (let i = 0; i < pcm.length; i++) {
    const u = pcm[i] & 0xffff;
    hash = Math.imul(hash ^ (u & 0xff), 0x01000193);
    hash = Math.imul(hash ^ (u >>> 8), 0x01000193);
  }
  return hash >>> 0;
}

function wavBlob(pieces, rate) {
  const samples = pieces.reduce((n, p) => n + p.length, 0);
  const header = new DataView(new ArrayBuffer(44));
  const text = (at, s) => [...s].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF"); header.setUint32(4, 36 + samples * 2, true); text(8, "WAVE");
  text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true);
  header.setUint16(22, 1, true); header.setUint32(24, rate, true); header.setUint32(28, rate * 2, true);
  header.setUint16(32, 2, true); header.setUint16(34, 16, true);
  text(36, "data"); header.setUint32(40, samples * 2, true);
  return new Blob([header, ...pieces], {type: "audio/wav"});
}

async function generate() {
  clearError();
  let body;
  try { body = requestBody(); } catch (error) { return showError(error); }
  const run = {started: performance.now(), controller: new AbortController()};
  state.run = run;
  const last = {body, rate: null, received: 0, receivedHash: null, played: 0,
                playedHash: null, underruns: 0, firstAudioMs: null, done: false, error: null,
                drained: false};
  window.tritonttsDemo.last = last;
  $("generate").disabled = true;
  $("stop").disabled = false;
  $("download").hidden = true;
  $("status").textContent = "Synthesizing...";
  let player = null;
  const pieces = [];
  try {
    // The context starts inside the click (browsers let audio start on a user's gesture),
    // at the model's declared rate; the response's X-Sample-Rate decides.
    player = await StreamPlayer.open(state.model.sample_rate);
    const response = await fetch(new URL("v1/audio/speech", API), {
      method: "POST", headers: headers(true), body: JSON.stringify(body), signal: run.controller.signal});
    if (!response.ok) throw await frontError(response);
    const rate = Number(response.headers.get("X-Sample-Rate")) || state.model.sample_rate;
    last.rate = rate;
    if (rate !== player.context.sampleRate) {
      await player.close();
      player = await StreamPlayer.open(rate);
    }
    const reader = response.body.getReader();
    let odd = null;             // a byte of a sample split between two reads
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      let bytes = value;
      if (odd !== null) {
        const joined = new Uint8Array(bytes.length + 1);
        joined[0] = odd;
        joined.set(bytes, 1);
        bytes = joined;
        odd = null;
      }
      if (bytes.length % 2) { odd = bytes[bytes.length - 1]; bytes = bytes.subarray(0, bytes.length - 1); }
      if (!bytes.length) continue;
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
      const samples = new Int16Array(bytes.length / 2);
      for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true);
      if (last.firstAudioMs === null) last.firstAudioMs = Math.round(performance.now() - run.started);
      pieces.push(samples.slice());
      last.received += samples.length;
      player.push(samples);
      $("status").textContent = `Playing: ${(last.received / rate).toFixed(1)} s received ` +
                                `(first audio after ${last.firstAudioMs} ms)`;
    }
    last.done = true;
    player.end();
    const whole = new Int16Array(last.received);
    let at = 0;
    for (const p of pieces) { whole.set(p, at); at += p.length; }
    last.receivedHash = fnv1a(whole);
    const link = $("download");
    link.href = URL.createObjectURL(wavBlob(pieces, rate));
    link.hidden = false;
    $("status").textContent = `Done: ${(last.received / rate).toFixed(2)} s at ${rate} Hz, ` +
                              `first audio after ${last.firstAudioMs} ms.`;
    await player.drained;
    Object.assign(last, {played: player.report.played, playedHash: player.report.hash,
                         underruns: player.report.underruns, drained: true});
  } catch (error) {
    last.error = {status: error.status || null, message: error.message, param: error.param || null};
    if (error.name === "AbortError") $("status").textContent = "Stopped.";
    else { $("status").textContent = ""; showError(error); }
  } finally {
    if (player) {
      if (!last.drained) Object.assign(last, {played: player.report.played, playedHash: player.report.hash,
                                              underruns: player.report.underruns});
      await player.close();
    }
    $("generate").disabled = false;
    $("stop").disabled = true;
    if (state.run === run) state.run = null;
  }
}

async function load() {
  try {
    const [models, voices] = await Promise.all([getJSON("v1/audio/models"), getJSON("v1/audio/voices")]);
    state.models = models.data;
    state.uploaded = (voices.data || []).filter((v) => v.kind !== "builtin");
  } catch (error) {
    $("status").textContent = "";
    showError({status: error.status, message: `cannot describe the served models: ${error.message}` +
               (error.status === 401 ? " (enter the API key, then reload)" : ""), param: error.param});
    return;
  }
  $("model").replaceChildren(...state.models.map((m) => el("option", {value: m.id}, m.id)));
  const wanted = new URLSearchParams(location.search).get("model");
  if (wanted && state.models.some((m) => m.id === wanted)) $("model").value = wanted;
  renderModel();
  document.body.dataset.ready = "true";
}

$("model").addEventListener("change", renderModel);
$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => state.run && state.run.controller.abort());
$("api-key").addEventListener("change", () => { localStorage.setItem("tritontts-api-key", $("api-key").value); load(); });
$("api-key").value = localStorage.getItem("tritontts-api-key") || "";
load();
