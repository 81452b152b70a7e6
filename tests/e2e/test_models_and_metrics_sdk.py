"""Small things a new user checks first, through the real server and the official SDKs:
every id ``/v1/models`` lists is retrievable in both API shapes with a real creation time;
a chain name matches ASCII case-insensitively only; and every metric the README names is
one ``/metrics`` exports."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.cluster.fenced import SNAPSHOTS_BUCKET
from actors.cluster.membership import HOSTS_BUCKET
from actors.cluster.placement import OWNERS_BUCKET
from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.gateway import REPO

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

ADMIN = "adm-models-key"
PRICING = {"prompt": 2.0, "completion": 10.0}  # USD per million tokens


async def _gateway(gateway_factory: GatewayFactory, up: FakeUpstream) -> RunningGateway:
    return await gateway_factory(
        config(
            model("m", route(up, pricing=PRICING)),
            admin_key=ADMIN,
            chains=[{"name": "kx", "models": ["m"]}],
        )
    )


async def test_every_listed_model_is_retrievable_in_both_shapes_with_a_real_creation_time(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    before = int(time.time())
    gw = await _gateway(gateway_factory, fake_upstream)
    after = int(time.time())
    oa, an = gw.openai(), gw.anthropic()

    listed = [m.id for m in (await oa.models.list()).data]
    assert {"m", "auto", "auto:fastest", "auto:kx"} <= set(listed)
    for model_id in listed:
        one = await oa.models.retrieve(model_id)
        info = await an.models.retrieve(model_id)
        assert (one.id, info.id) == (model_id, model_id)
        assert before <= one.created <= after, (model_id, one.created)
        assert info.created_at == datetime.fromtimestamp(one.created, UTC), model_id
    for missing in ("auto:nope", "nope"):
        with pytest.raises(openai.NotFoundError):
            await oa.models.retrieve(missing)
        with pytest.raises(anthropic.NotFoundError):
            await an.models.retrieve(missing)


async def test_a_chain_name_matches_ascii_case_insensitively_only(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await _gateway(gateway_factory, fake_upstream)
    client = gw.openai()

    served = await client.chat.completions.create(model="auto:KX", messages=HI)
    with pytest.raises(openai.BadRequestError) as kelvin:
        # U+212A KELVIN SIGN lower-cases to "k" under Unicode rules: not this chain.
        await client.chat.completions.create(model="auto:\u212ax", messages=HI)
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("auto:\u212ax")

    assert served.choices[0].message.content
    assert kelvin.value.status_code == 400
    assert len(fake_upstream.requests) == 1


async def test_every_metric_the_readme_names_is_exported(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    gw = await gateway_factory(
        config(
            model("m", route(fake_upstream, pricing=PRICING)),
            model("u", route(fake_upstream)),  # unpriced: llmgw_unpriced_attempts_total
            admin_key=ADMIN,
        )
    )
    for name in ("m", "u"):
        await gw.openai().chat.completions.create(model=name, messages=HI, max_tokens=5)
    readme = (REPO / "README.md").read_text()

    text = (await gw.http().get("/metrics", headers={"authorization": f"Bearer {ADMIN}"})).text

    # Every `llmgw_…` name the README gives is a metric, but for the cluster's JetStream buckets.
    buckets = {HOSTS_BUCKET, OWNERS_BUCKET, SNAPSHOTS_BUCKET}
    named = set(re.findall(r"\bllmgw_[a-z_]+[a-z]", readme)) - buckets
    samples = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert "llmgw_spend_usd_total" in named
    assert named <= samples, named - samples
    unpriced = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "llmgw_unpriced_attempts_total"
    ]
    assert [(s.labels["model"], s.value) for s in unpriced] == [("u", 1.0)]
