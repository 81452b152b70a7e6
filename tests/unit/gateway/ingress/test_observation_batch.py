"""Observations sent together (gateway/ingress/observation_batch.py): over NATS the ones an
ingress makes of one endpoint in one turn leave as one ObservationBatch, and the receiving bus
delivers each as its own Observation, to a subscriber of the endpoint's subject and to one of
the family's wildcard alike; in process nothing is held."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import nats
import pytest

from bus import NatsBus
from bus.codec import decode
from gateway.ingress.observation_batch import ObservationBatcher, observation_batcher
from schemas import Observation, ObservationBatch, subjects

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from bus import InProcessBus

WAIT = 5.0  # seconds a test waits for what it expects before it fails


def _obs(request_id: str, endpoint: str = "m:e") -> Observation:
    return Observation(endpoint=endpoint, model="m", outcome="success", request_id=request_id)


async def test_in_process_an_observation_is_published_as_it_comes(bus: InProcessBus) -> None:
    assert observation_batcher(bus) is None  # none held: the settler publishes each at once


@pytest.mark.nats
async def test_a_turns_observations_of_an_endpoint_go_as_one_message_and_arrive_one_by_one(
    nats_url: str,
) -> None:
    subject, other = subjects.observation("m:e"), subjects.observation("m:f")
    raw = await nats.connect(nats_url)
    ingress = await NatsBus.connect(nats_url)
    plain = await NatsBus.connect(nats_url)  # subscribes to the endpoint's subject
    family = await NatsBus.connect(nats_url, families=(subjects.OBSERVATION_ANY,))
    on_wire: list[type] = []
    wire = asyncio.Event()

    async def count(msg: Msg) -> None:
        on_wire.append(type(decode(msg.data)))
        if len(on_wire) == 2:
            wire.set()

    try:
        await raw.subscribe(subjects.OBSERVATION_ANY, cb=count)
        await raw.flush()
        async with (
            plain.subscribe(subject) as one,
            family.subscribe(subjects.OBSERVATION_ANY) as every,
        ):
            batcher = observation_batcher(ingress)
            assert isinstance(batcher, ObservationBatcher)
            sender = batcher.publish
            for rid in ("r-1", "r-2", "r-3"):
                await sender(subject, _obs(rid))
            await sender(other, _obs("r-4", "m:f"))
            async with asyncio.timeout(WAIT):
                got_one = [(await anext(aiter(one))).message for _ in range(3)]
                got_every = [(await anext(aiter(every))).message for _ in range(4)]
                await wire.wait()
    finally:
        for b in (ingress, plain, family):
            await b.aclose()
        await raw.close()

    assert [o.request_id for o in got_one if isinstance(o, Observation)] == ["r-1", "r-2", "r-3"]
    seen = sorted(o.request_id for o in got_every if isinstance(o, Observation))
    assert seen == ["r-1", "r-2", "r-3", "r-4"]
    assert sorted(t.__name__ for t in on_wire) == ["Observation", "ObservationBatch"]
    assert ObservationBatch in on_wire  # the three of m:e in one message, m:f's alone
