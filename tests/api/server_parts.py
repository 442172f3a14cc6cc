"""The gateway's server with each part of a request's path entered through a C function of its own.

    python -m tests.api.server_parts serve --config FILE      # as ``python -m gateway serve``

Profiling only (:mod:`tests.api.server_cost` ``--parts`` runs it under callgrind). CPython 3.11 runs a
Python function called from Python inside the caller's evaluation loop, so callgrind cannot tell the
parts of a request apart; a part entered through a C function that nothing else on the path calls
(``operator.call``, ``functools.reduce``, ``itertools.starmap`` ...) shows as that function, and its
inclusive count is the part's cost (with a few hundred instructions of the detour). :data:`PARTS` names
each C function and the part it stands for; the request's task as a whole is ``task_step_impl``.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import operator
import sys
from typing import Any

#: callgrind's name of each C function, what it stands for, and (indented) the part it is a piece of
PARTS: list[tuple[str, str]] = [
    ("_operator_call", "the client's connection: its reads parsed, the protocol's callbacks"),
    ("functools_reduce", "  of which the head's end: the cycle, the request's task, the client's state"),
    ("filter_next", "the upstream connection's reads: the response parsed, the request woken"),
    ("task_step_impl", "the request's task"),
    ("starmap_next", "  the routing decision (AdaptivePolicy.decide)"),
    ("context_run", "    of which the classifier (Classifier.predict)"),
    ("dropwhile_next", "  the observation after the response (metrics, feedback, access-log record)"),
    ("filterfalse_next", "  validation (parse_body: JSON, the fields' types, the model)"),
    ("takewhile_next", "  the upstream request's head (wire._request_head)"),
]


def install() -> None:
    from classifiers import model
    from gateway import connections
    from gateway.api import request, routes
    from gateway.routing import adaptive
    from gateway.upstream import wire

    protocol = connections.GuardedHttpProtocol
    received = protocol.data_received
    protocol.data_received = lambda self, data: operator.call(received, self, data)  # type: ignore[method-assign]
    headed = protocol.on_headers_complete
    protocol.on_headers_complete = lambda self: functools.reduce(  # type: ignore[method-assign]
        lambda a, b: headed(self), (0,), None
    )
    upstream = wire._Connection.data_received
    wire._Connection.data_received = lambda self, data: list(  # type: ignore[method-assign]
        filter(lambda s: upstream(s, data), (self,))
    )

    def through(run: Any, f: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            out: list[Any] = []
            list(run(lambda *_: out.append(f(*args, **kwargs)), ((),) if run is itertools.starmap else (0,)))
            return out[0]

        return call

    adaptive.AdaptivePolicy.decide = through(itertools.starmap, adaptive.AdaptivePolicy.decide)  # type: ignore[method-assign]
    predict = model.Classifier.predict
    model.Classifier.predict = lambda self, body: contextvars.Context().run(predict, self, body)  # type: ignore[method-assign]
    routes._finish = through(itertools.dropwhile, routes._finish)
    routes.parse_body = request.parse_body = through(itertools.filterfalse, request.parse_body)
    wire._request_head = through(
        lambda f, it: itertools.takewhile(lambda x: f(x) or False, it), wire._request_head
    )


if __name__ == "__main__":
    install()
    sys.argv = ["specroute", *sys.argv[1:]]
    from gateway.cli import main

    main()
