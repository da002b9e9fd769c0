"""The rules of issue 32 written once in kernels/, each on its own: "a record covers this config
list" (kernels.configs.covers) and "nearest" (kernels.resolve.nearest, one tie-break)."""
from __future__ import annotations

import itertools
import math

from kernelsearch.kernels.configs import canonical_key, covers
from kernelsearch.kernels.resolve import (NEAREST_MAX_RATIO, Found, Key, Match, Resolver, nearest, nearest_of,
                                         within)

A = {"BLOCK": 32, "num_warps": 4}
B = {"BLOCK": 64, "num_warps": 4}
C = {"BLOCK": 128, "num_warps": 8}
PRUNED = {"BLOCK": 16, "num_warps": 2}  # a config the call's pruner made, beyond the list


def timings(*configs: dict, failed: tuple = ()) -> dict[str, float | None]:
    out: dict[str, float | None] = {canonical_key(c): 10.0 + i for i, c in enumerate(configs)}
    out.update({canonical_key(c): None for c in failed})
    return out


def test_a_record_that_timed_every_listed_config_covers_the_list() -> None:
    assert covers(timings(A, B), A, [A, B])
    # A failed config (None) was measured: it counts.
    assert covers(timings(A, failed=(B,)), A, [A, B])


def test_a_partly_measured_list_is_not_covered() -> None:
    assert not covers(timings(A), A, [A, B])
    assert not covers(timings(A, C), A, [A, B])
    assert not covers({}, A, [A])
    assert not covers(None, A, [A])
    assert not covers(timings(A), A, [])


def test_the_winner_must_be_listed_or_beyond_the_list() -> None:
    assert not covers(timings(A, B, C), C, [A, B])
    assert covers(timings(A, B, C), C, [A, B], beyond=[C])
    # The pruner's configs (Definition.pruned) are accepted as the winner, and as the list.
    assert covers(timings(A, B, PRUNED), PRUNED, [A, B], beyond=[PRUNED])
    assert covers(timings(A, PRUNED), PRUNED, [A, PRUNED])


def test_order_and_spelled_out_launch_defaults_do_not_matter() -> None:
    spelled = {"num_ctas": 1, "num_stages": 3, "num_warps": 4, "BLOCK": 64, "maxnreg": None}
    assert covers(timings(A, B), spelled, [B, A])
    assert covers(timings(A, spelled), A, [{"num_warps": 4, "BLOCK": 32}, B])


def test_nearest_takes_the_least_finite_distance() -> None:
    cands = [(3.0, {"n": 3}, "c3"), (1.0, {"n": 1}, "c1"), (math.inf, {"n": 0}, "c0")]
    assert nearest(cands) == ("c1", 1.0)
    assert nearest([(math.inf, {"n": 1}, "x"), (math.nan, {"n": 2}, "y")]) is None
    assert nearest([]) is None


def test_a_tie_is_broken_by_the_axes_whatever_the_order() -> None:
    cands = [(2.0, {"n": 8, "m": 1}, "b"), (2.0, {"m": 1, "n": 16}, "a"), (5.0, {"n": 1}, "z")]
    picks = {nearest(list(p)) for p in itertools.permutations(cands)}
    # '{"m":1,"n":16}' sorts before '{"m":1,"n":8}': one answer in every order.
    assert picks == {("a", 2.0)}


def test_nearest_of_uses_the_one_rule() -> None:
    key = Key.of("k", {"n": 4}, "dev")
    snap = {(("n", 8),): "r8", (("n", 16),): "r16"}  # both 4 away by this `near`
    near = {8: 4.0, 16: 4.0}
    for order in (snap, dict(reversed(list(snap.items())))):
        assert nearest_of(key, lambda ax: near[ax["n"]], order) == ((("n", 16),), 4.0)
    assert nearest_of(key, None, snap) is None
    assert nearest_of(Key.of("k", {"n": 8}, "dev"), None, snap) == ((("n", 8),), 0.0)


class _Near:
    """A source whose one record is `distance` away from every key."""

    name = "fake"

    def __init__(self, distance: float) -> None:
        self.distance = distance

    def get(self, key: Key, near, fresh: bool) -> Found | None:
        return None if near is None else Found({"B": 1}, Match.NEAREST, "fake", distance=self.distance)

    def known(self, key: Key, near) -> Found | None:
        return self.get(key, near, False)


def test_the_resolver_serves_nearest_only_within_the_one_bound() -> None:
    """Every caller of the resolver (route, decorator, provider) gets the same bound: at exactly
    NEAREST_MAX_RATIO served, past it not, and a caller's own ratio replaces it."""
    key = Key.of("k", {"n": 4}, "dev")
    at = math.log(NEAREST_MAX_RATIO)
    assert Resolver([_Near(at)]).resolve(key, near=lambda _: at) is not None
    assert Resolver([_Near(at * (1 + 1e-9))]).resolve(key, near=lambda _: 0.0) is None
    assert Resolver([_Near(math.log(8.0))], max_ratio=4.0).resolve(key, near=lambda _: 0.0) is None
    assert Resolver([_Near(math.log(64.0))]).resolve(key, near=lambda _: 0.0, max_ratio=math.inf) is not None
    assert within(at) and not within(math.inf) and not within(math.nan)
