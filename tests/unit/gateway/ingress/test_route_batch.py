"""Route requests sent together (gateway/ingress/route_batch.py): the ones begun in one turn
of the event loop for one model reach its owner as one RouteBatch, each asker gets its own
answer (a plan, or the error it alone met) or the error the batch met; a turn's only request
goes as it is; on NATS the ingress batches, in process it does not. The batcher runs here on
the in-process bus against a scripted owner (what it sends is what an owner gets over NATS),
and on a real nats-server against a real ModelActor."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from actors import ChildSpec, ModelActor, Supervisor
from bus import InProcessBus, NatsBus
from gateway.ingress.route_batch import BATCH_MAX, RouteBatcher, route_asker
from schemas import (
    ErrorCode,
    ErrorReply,
    Message,
    NoRespondersError,
    RouteBatch,
    RouteBatchReply,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
    subjects,
)
from schemas.config import ModelConfig, RoutingConfig

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import Envelope

M, N = subjects.model_route("m"), subjects.model_route("n")
WAIT = 5.0  # seconds a test waits for what it expects before it fails
REFUSED = "r-refused"  # the scripted owner refuses this request alone


def _answer(req: RouteRequest) -> RoutePlan | ErrorReply:
    if req.request_id == REFUSED:
        return ErrorReply(code=ErrorCode.PIN_NOT_FOUND.value, message="no such pin")
    return RoutePlan(
        model=req.model, candidates=(RouteCandidate(endpoint=req.request_id, kind="echo"),)
    )


class Owner:
    """A model's scripted owner: records each message it gets and answers it."""

    def __init__(self) -> None:
        self.got: list[Message] = []
        self.subscribed = asyncio.Event()
        self.arrived = asyncio.Event()
        self.answering = asyncio.Event()  # cleared: messages wait unanswered

    async def serve(self, bus: InProcessBus, subject: str) -> None:
        async with bus.subscribe(subject) as sub:
            self.subscribed.set()
            async for env in sub:
                self.got.append(env.message)
                self.arrived.set()
                await self._answer(env)

    async def _answer(self, env: Envelope) -> None:
        await self.answering.wait()
        match env.message:
            case RouteBatch(requests=requests):
                await env.respond(RouteBatchReply(replies=tuple(_answer(r) for r in requests)))
            case RouteRequest() as req:
                await env.respond(_answer(req))


@pytest.fixture
async def owners(bus: InProcessBus) -> AsyncIterator[dict[str, Owner]]:
    found = {M: Owner(), N: Owner()}
    tasks = [asyncio.create_task(o.serve(bus, s)) for s, o in found.items()]
    for o in found.values():
        o.answering.set()
    for o in found.values():
        await o.subscribed.wait()
    yield found
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def ask(batcher: RouteBatcher, subject: str, request_id: str) -> asyncio.Task[object]:
    req = RouteRequest(model=subject.split(".")[2], request_id=request_id)
    return asyncio.ensure_future(batcher.ask(subject, req, timeout=WAIT))


def endpoint_of(answer: object) -> str:
    assert isinstance(answer, RoutePlan), answer
    return answer.candidates[0].endpoint


async def test_the_route_requests_of_one_turn_reach_their_owner_as_one_batch(
    bus: InProcessBus, owners: dict[str, Owner]
) -> None:
    batcher = RouteBatcher(bus)

    async with asyncio.timeout(WAIT):
        answers = await asyncio.gather(*(ask(batcher, M, rid) for rid in ("r-1", REFUSED, "r-3")))

    (got,) = owners[M].got
    assert isinstance(got, RouteBatch)
    assert [r.request_id for r in got.requests] == ["r-1", REFUSED, "r-3"]
    first, refused, third = answers
    assert (endpoint_of(first), endpoint_of(third)) == ("r-1", "r-3")
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.PIN_NOT_FOUND


async def test_a_turns_only_route_request_goes_as_it_is_and_each_model_gets_its_own(
    bus: InProcessBus, owners: dict[str, Owner]
) -> None:
    batcher = RouteBatcher(bus)

    async with asyncio.timeout(WAIT):
        alone = await ask(batcher, M, "r-1")
        both = await asyncio.gather(ask(batcher, M, "r-2"), ask(batcher, N, "r-3"))

    assert endpoint_of(alone) == "r-1" and [endpoint_of(a) for a in both] == ["r-2", "r-3"]
    assert [type(m) for m in owners[M].got] == [RouteRequest, RouteRequest]
    assert [type(m) for m in owners[N].got] == [RouteRequest]


async def test_a_turn_of_more_requests_than_a_batch_holds_goes_in_several(
    bus: InProcessBus, owners: dict[str, Owner]
) -> None:
    batcher = RouteBatcher(bus)
    ids = [f"r-{i}" for i in range(BATCH_MAX + 2)]

    async with asyncio.timeout(WAIT):
        answers = await asyncio.gather(*(ask(batcher, M, rid) for rid in ids))

    assert [endpoint_of(a) for a in answers] == ids
    sizes = [len(m.requests) if isinstance(m, RouteBatch) else 1 for m in owners[M].got]
    assert sizes == [BATCH_MAX, 2]


async def test_a_batch_without_an_owner_fails_each_of_its_requests_with_no_responders(
    bus: InProcessBus,
) -> None:
    batcher = RouteBatcher(bus)

    async with asyncio.timeout(WAIT):
        results = await asyncio.gather(
            ask(batcher, M, "r-1"), ask(batcher, M, "r-2"), return_exceptions=True
        )

    assert all(isinstance(r, NoRespondersError) for r in results) and len(results) == 2


async def test_a_request_gone_from_its_batch_leaves_the_others_answered(
    bus: InProcessBus, owners: dict[str, Owner]
) -> None:
    batcher = RouteBatcher(bus)
    owners[M].answering.clear()
    gone, kept = ask(batcher, M, "r-1"), ask(batcher, M, "r-2")
    await owners[M].arrived.wait()  # the batch is with the owner

    gone.cancel()
    owners[M].answering.set()
    async with asyncio.timeout(WAIT):
        answer = await kept

    assert endpoint_of(answer) == "r-2" and gone.cancelled()
    assert [type(m) for m in owners[M].got] == [RouteBatch]


async def test_a_request_gone_before_its_batch_leaves_is_not_sent(
    bus: InProcessBus, owners: dict[str, Owner]
) -> None:
    # No plan (and no lease with it) is made for a request nobody waits for any more.
    batcher = RouteBatcher(bus)
    gone, kept = ask(batcher, M, "r-1"), ask(batcher, M, "r-2")
    await asyncio.sleep(0)  # both asked, the batch not yet sent
    gone.cancel()

    async with asyncio.timeout(WAIT):
        answer = await kept

    assert endpoint_of(answer) == "r-2"
    assert [(type(m), getattr(m, "request_id", None)) for m in owners[M].got] == [
        (RouteRequest, "r-2")
    ]


async def test_the_ingress_batches_route_requests_on_nats_only(bus: InProcessBus) -> None:
    assert not isinstance(getattr(route_asker(bus), "__self__", None), RouteBatcher)


@pytest.mark.nats
async def test_a_batch_over_nats_gets_each_request_a_plan_from_a_real_model_actor(
    nats_url: str,
) -> None:
    model = ModelConfig.model_validate(
        {"id": "m", "route": [{"kind": "echo", "provider_model_id": "e"}]}
    )
    routing = RoutingConfig.model_validate({"affinity": {"enabled": False}})
    actors_bus = await NatsBus.connect(nats_url)
    ingress_bus = await NatsBus.connect(nats_url)
    root = Supervisor("test", children=[ChildSpec("model", lambda: ModelActor(model, routing))])
    await root.start(actors_bus)
    try:
        ask_route = route_asker(ingress_bus)
        assert isinstance(getattr(ask_route, "__self__", None), RouteBatcher)
        async with asyncio.timeout(WAIT):
            plans = await asyncio.gather(
                *(
                    ask_route(M, RouteRequest(model="m", request_id=f"r-{i}"), timeout=WAIT)
                    for i in range(5)
                )
            )
    finally:
        await root.stop()
        await ingress_bus.aclose()
        await actors_bus.aclose()

    assert all(isinstance(p, RoutePlan) and p.candidates for p in plans), plans
