"""The worker: the asyncio thread that drains the queue, maps each snapshot and records it."""
