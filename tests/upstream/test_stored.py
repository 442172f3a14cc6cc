"""Where each stored response was made: a bounded map, least recently used out first."""

from __future__ import annotations

import orjson

from gateway.config import load_settings
from gateway.stack import demo_config, free_port
from gateway.types import PoolName
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.stored import StoredResponses, response_id
from tests.upstream.wiring import upstreams_for


def _pools() -> dict[PoolName, Pool]:
    spec = [Endpoint("speculative", f"s{i}", f"http://s{i}") for i in range(2)]
    base = [Endpoint("baseline", f"b{i}", f"http://b{i}") for i in range(2)]
    return {"speculative": Pool("speculative", ["m"], spec), "baseline": Pool("baseline", ["m"], base)}


def test_the_least_recently_used_id_goes_first_past_the_capacity() -> None:
    pools = _pools()
    s0, s1 = pools["speculative"].endpoints
    stored = StoredResponses(capacity=3)
    for i, endpoint in enumerate([s0, s1, s0]):
        stored.remember(f"resp_{i}", endpoint)
    assert stored.holder("resp_0", pools) is s0  # used: now the most recent
    stored.remember("resp_3", s1)
    assert len(stored) == 3
    assert stored.holder("resp_1", pools) is None  # the oldest unused went
    assert [stored.holder(f"resp_{i}", pools) for i in (0, 2, 3)] == [s0, s0, s1]
    stored.remember("resp_2", s1)  # made again elsewhere (the id moved): the latest note counts
    assert stored.holder("resp_2", pools) is s1 and len(stored) == 3


def test_an_endpoint_that_left_its_pool_holds_nothing_more() -> None:
    pools = _pools()
    s0, s1 = pools["speculative"].endpoints
    b0 = pools["baseline"].endpoints[0]
    stored = StoredResponses()
    stored.remember("resp_a", s0)
    stored.remember("resp_b", s1)
    stored.remember("resp_c", b0)
    pools["speculative"].set_endpoints([Endpoint("speculative", "s1", "http://s1")])  # discovery: s0 left
    assert stored.holder("resp_a", pools) is None  # draining: never sent anything more
    assert stored.holder("resp_b", pools) is s1
    moved = Endpoint("speculative", "b0", b0.base_url)  # its address now serves the other pool
    pools["baseline"].endpoints.remove(b0)
    pools["speculative"].endpoints.append(moved)
    assert stored.holder("resp_c", pools) is None  # the id is looked for everywhere instead
    stored.remember("resp_d", s1)
    stored.forget(s1)
    assert stored.holder("resp_b", pools) is None and stored.holder("resp_d", pools) is None
    assert len(stored) == 0


async def test_an_endpoint_discovery_removed_drops_out_of_the_map() -> None:
    urls = [f"http://127.0.0.1:{free_port()}"]
    settings = load_settings(overrides=demo_config(urls, urls, free_port()))
    async with upstreams_for(settings) as upstreams:
        endpoint = upstreams.pools["speculative"].endpoints[0]
        upstreams.stored.remember("resp_x", endpoint)
        upstreams.forget(endpoint)  # what discovery calls once it drained
        assert len(upstreams.stored) == 0


def test_the_id_of_an_answer_is_read_first_cheaply_else_by_parsing() -> None:
    answer = {"id": "resp_1", "object": "response", "output": [{"id": "msg_2"}]}
    assert response_id(orjson.dumps(answer)) == "resp_1"
    assert response_id(b' {\n  "id" : "resp_3", "object": "response"}') == "resp_3"
    reordered = {"object": "response", "output": [{"id": "msg_2"}], "id": "resp_4"}
    assert response_id(orjson.dumps(reordered)) == "resp_4"
    assert response_id(orjson.dumps({"id": 'resp_\u00e9\\"x'})) == 'resp_\u00e9\\"x'
    for body in (b"not json", b"[1, 2]", b'{"id": 7}', b'{"id": ""}', b"{}"):
        assert response_id(body) is None
