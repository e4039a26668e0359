"""Locust file: the load generator's workloads and answer checks, for users who prefer Locust.

    pip install -e '.[loadtest]'
    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 \\
        --headless --users 200 --spawn-rate 50 --run-time 2m

Each simulated user sends a request (or a batch of ``LOADTEST_BATCH``) as soon as the last one
is answered. An answer that is not what its item expects is a Locust failure naming the kinds
of items that were wrong; a 429 is a failure too (Locust does not retry). The environment
chooses the traffic: ``LOADTEST_WORKLOAD`` (any spec ``python -m loadtests`` takes; default
``trivial``), ``LOADTEST_BATCH`` (default 1) and ``LOADTEST_SEED`` (default: random per user).

Locust times whole HTTP exchanges; it cannot split queue wait from run time or count lost
executions apart from failed requests. ``python -m loadtests`` is the reference tool.
"""

from __future__ import annotations

import itertools
import os
import random
from urllib.parse import urlsplit

from locust import FastHttpUser, constant, task

from loadtests.workloads import Context, parse

FOREVER = 10**15


class SandboxUser(FastHttpUser):
    wait_time = constant(0)

    def on_start(self) -> None:
        workload = parse(os.environ.get("LOADTEST_WORKLOAD", "trivial"))
        seed = int(os.environ.get("LOADTEST_SEED", random.randrange(2**32)))
        port = urlsplit(self.host or "").port or 80
        self.items = workload.items(FOREVER, seed, Context(port=port))
        self.batch = max(1, int(os.environ.get("LOADTEST_BATCH", "1")))

    @task
    def execute(self) -> None:
        items = list(itertools.islice(self.items, self.batch))
        if self.batch == 1:
            path, body = "/v1/execute", items[0].request
        else:
            path, body = "/v1/execute/batch", {"requests": [i.request for i in items]}
        with self.client.post(path, json=body, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
                return
            data = response.json()
            results = [data] if self.batch == 1 else data["results"]
            wrong = sorted({i.kind for i, r in zip(items, results, strict=True) if not i.check(r)})
            if wrong:
                response.failure(f"wrong answer: {', '.join(wrong)}")
