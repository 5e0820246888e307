"""GET /v1/audio/models (what each served model takes, from its Family descriptor and its
checkpoint's Form), the X-Sample-Rate header of audio responses, and the demo page's files
at /demo/ (open without the API key; the API behind them is not), against a scripted Triton."""
from __future__ import annotations

from fake_triton import FakeTritonClient, run_async, serving, tone_chunks

from tritontts.families import DEFAULT_FAMILY, FAMILIES
from tritontts.protocol import FIELD_KINDS, MAIN_FIELDS

KINDS = {"text", "long_text", "audio", "integer", "number", "boolean", "choice", "json", "internal"}


def test_every_field_a_family_takes_has_a_kind_a_form_can_show():
    assert set(FIELD_KINDS.values()) <= KINDS
    missing = {f"{name}.{field}" for name, family in FAMILIES.items()
               for field in family.fields.takes if field not in FIELD_KINDS}
    assert not missing, f"declare these fields' kinds in tritontts.protocol.FIELD_KINDS: {sorted(missing)}"
    assert set(MAIN_FIELDS) <= set(FIELD_KINDS)


@run_async
async def test_every_served_model_is_described_with_its_fields_less_hidden_and_internal_ones():
    async with serving(FakeTritonClient(), list(FAMILIES)) as front:
        r = await front.http.get("/v1/audio/models")
    assert r.status_code == 200
    described = {m["id"]: m for m in r.json()["data"]}
    assert list(described) == list(FAMILIES)
    for name, family in FAMILIES.items():
        model, form = described[name], family.form(None)
        names = [f["name"] for f in model["fields"]]
        expected = ({*family.fields.takes, "speed"} - set(form.hidden)
                    - {n for n, k in FIELD_KINDS.items() if k == "internal"})
        assert set(names) == expected and len(names) == len(expected), name
        main = [n for n in names if n in MAIN_FIELDS]
        assert names[:len(main)] == [n for n in MAIN_FIELDS if n in main], "main fields first, in order"
        assert all(f["advanced"] == (f["name"] not in MAIN_FIELDS) for f in model["fields"])
        for f in model["fields"]:
            assert f["description"], (name, f["name"])
            if f["name"] in form.choices:
                assert f["kind"] == "choice" and f["choices"] == list(form.choices[f["name"]])
            assert f["kind"] != "choice" or f["choices"], "a choice without values is shown as text"
        required = {f["name"] for f in model["fields"] if f["required"]}
        assert required == set(form.required) | ({"ref_audio"} if form.reference_required else set())
        assert model["sample_rate"] == family.capabilities.sample_rate
        assert model["input_required"] is not family.capabilities.instruction_only
        assert model["uploads_voices"] is (family.voice_encoder is not None)
        assert model["ready"] is True


@run_async
async def test_a_model_triton_has_not_loaded_is_described_as_not_ready():
    async with serving(FakeTritonClient(ready=set()), [DEFAULT_FAMILY]) as front:
        r = await front.http.get("/v1/audio/models")
    assert [m["ready"] for m in r.json()["data"]] == [False]


@run_async
async def test_audio_responses_say_their_sample_rate_streamed_whole_and_resampled():
    async with serving(FakeTritonClient(tone_chunks(2), sample_rate=24000)) as front:
        streamed = await front.speech(response_format="pcm", stream_format="audio")
        whole = await front.speech(response_format="wav")
        resampled = await front.speech(response_format="pcm", stream_format="audio", sample_rate=16000)
        sse = await front.speech(response_format="pcm", stream_format="sse")
    assert [r.headers["X-Sample-Rate"] for r in (streamed, whole, resampled, sse)] == ["24000", "24000", "16000",
                                                                                       "24000"]


@run_async
async def test_the_demo_page_is_served_without_the_key_and_the_api_behind_it_is_not():
    async with serving(FakeTritonClient(), api_key="sekret") as front:
        page = await front.http.get("/demo/")
        script = await front.http.get("/demo/demo.js")
        worklet = await front.http.get("/demo/pcm-player.js")
        redirect = await front.http.get("/demo")
        models = await front.http.get("/v1/audio/models")
        keyed = await front.http.get("/v1/audio/models", headers={"Authorization": "Bearer sekret"})
        missing = await front.http.get("/demo/nothing.js")
    assert page.status_code == 200 and "<script src=\"demo.js\">" in page.text
    assert script.status_code == 200 and "v1/audio/models" in script.text
    assert worklet.status_code == 200 and "registerProcessor(\"pcm-player\"" in worklet.text
    assert redirect.status_code == 307 and redirect.headers["location"].endswith("/demo/")
    assert models.status_code == 401 and keyed.status_code == 200
    assert missing.status_code == 404
