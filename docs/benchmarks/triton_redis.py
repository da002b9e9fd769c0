"""Triton 3.6.0's own `RedisRemoteCacheBackend`, given the one attribute it lacks: it reads its
settings from `knobs.cache.redis`, and Triton 3.6.0 keeps them at `knobs.redis`
(`TRITON_REDIS_HOST`, `TRITON_REDIS_PORT`, `TRITON_REDIS_KEY_FORMAT`), so the unpatched class
raises AttributeError when built. Everything else is Triton's: the baseline of issue 25's cache
manager (`TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager`,
`TRITON_REMOTE_CACHE_BACKEND=triton_redis:RedisBackend`, docs/benchmarks on PYTHONPATH).
"""
from triton import knobs
from triton.runtime.cache import RedisRemoteCacheBackend


class RedisBackend(RedisRemoteCacheBackend):
    def __init__(self, key: str) -> None:
        if not hasattr(knobs.cache, "redis"):
            knobs.cache.redis = knobs.redis
        super().__init__(key)
