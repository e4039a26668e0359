"""The Redis queue: any number of API nodes and worker nodes on any machines, one Redis.

One module per role: ``producer`` (``RedisQueue``, the API node's ``Queue``), ``consumer``
(``RedisJobSource``, the worker node's ``JobSource``), ``connection`` (``RedisLink`` and the
wire format, shared by both), ``keys`` (every key, one screen) and ``scripts`` (the Lua that
changes the queue atomically). Jobs travel in chunks on one stream read by a consumer group,
are acknowledged only once answered, and are taken over from silent workers; docs/redis.md
says what this guarantees and why it is built so.
"""
