"""SGLang 0.5.23's layer-wise load counter, driven by the store's per-layer progress.

0.5.23's contract (`LayerWiseLoadCounter`): `update_producer()` opens a batch with one
future per layer, the forward points the counter at it (`set_consumer`) and, before
each layer's attention, the KV pool calls `wait_until(layer)`, which returns once that
layer resolved (landed, or failed: a failure never raises into the forward, which runs
on whatever the slots hold); `finish(index)` answers whether every layer landed.

`LayerCounter(layers, advance)` keeps that contract and adds what makes it true for a
store: `layers` maps each of SGLang's layer ids (the KV pool's, ``layer_id -
start_layer``; an `SWAKVPool` numbers its Full and SWA layers together) to the pool and
the pool's own layer that hold it (``None``: a layer no pool of the store holds, landed
at once). A wait on a layer that has not resolved calls ``advance(index, layer)``: the
linker drives the store until the layer resolves or its batch fails — bounded in time,
so nothing waits forever. `land(index, loaded)` completes, in layer order, every layer
whose pool has landed that many of its own layers (``loaded``: pool -> layers landed,
a prefix); a gap stops it (layers complete in order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sglang.srt.mem_cache.unified_cache.unified_cache_linker import LayerWiseLoadCounter

from unicache_fsm.pools.transfer import PoolName

__all__ = ["LayerCounter", "LayerMap"]

#: SGLang layer id -> (pool, the pool's own layer), or None when no pool holds it
LayerMap = Sequence[tuple[PoolName, int] | None]


class LayerCounter(LayerWiseLoadCounter):  # type: ignore[misc]
    """0.5.23's counter whose waits drive the store (module docstring)."""

    def __init__(self, layers: LayerMap, advance: Callable[[int, int], None]) -> None:
        super().__init__(len(layers))
        self.layers = tuple(layers)
        self._advance = advance
        self._next: dict[int, int] = {}  # batch -> first layer not completed

    def pending(self, index: int, layer: int) -> bool:
        """Whether `layer` of batch `index` has not resolved yet."""
        futures = self.futures.get(index)
        return futures is not None and 0 <= layer < len(futures) and not futures[layer].done()

    def wait_until(self, threshold: int) -> None:
        index = self.consumer_index
        if self.pending(index, threshold):
            self._advance(index, threshold)
            if self.pending(index, threshold):  # `advance` must resolve it; never block
                self.fail(index, TimeoutError(f"layer {threshold} of batch {index} never landed"))
        super().wait_until(threshold)

    def land(self, index: int, loaded: Mapping[PoolName, int]) -> None:
        """Complete, in order, the layers of batch `index` that `loaded` covers."""
        futures = self.futures.get(index)
        if futures is None:
            return
        layer = self._next.get(index, 0)
        while layer < len(futures):
            where = self.layers[layer]
            if where is not None and loaded.get(where[0], 0) <= where[1]:
                break
            if not futures[layer].done():
                self.complete(index, layer)
            layer += 1
        self._next[index] = layer

    def land_all(self, index: int) -> None:
        """Every layer of batch `index` landed."""
        futures = self.futures.get(index, ())
        for layer, future in enumerate(futures):
            if not future.done():
                self.complete(index, layer)
        self._next.pop(index, None)

    def fail(self, index: int, error: BaseException) -> None:
        super().fail(index, error)
        self._next.pop(index, None)

    def finish(self, index: int) -> bool:
        self._next.pop(index, None)
        landed: bool = super().finish(index)
        return landed

    def reset(self) -> None:
        super().reset()
        self._next.clear()
