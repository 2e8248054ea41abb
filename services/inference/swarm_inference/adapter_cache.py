"""Which adapter holds which slot: least recently used first out, never one in use."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

from swarm_inference.adapter_files import AdapterSource, AdapterWeights, read_adapter
from swarm_inference.lora_slots import LoraSlots

log = logging.getLogger(__name__)


class AdapterCache:
    """Maps adapter keys to slots of ``LoraSlots``; a pinned adapter (a row of the running
    batch, or an admitted request, uses it) is never evicted."""

    def __init__(
        self, slots: LoraSlots, reader: Callable[[AdapterSource], AdapterWeights] = read_adapter
    ) -> None:
        self.slots = slots
        self.reader = reader
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._pins: dict[str, int] = {}
        self.loads = 0
        self.evictions = 0

    @property
    def capacity(self) -> int:
        return self.slots.capacity

    def loaded(self) -> list[str]:
        return list(self._slot_of)

    def free_slots(self) -> int:
        return self.capacity - len(self._slot_of)

    def slot_of(self, key: str) -> int | None:
        return self._slot_of.get(key)

    def _victim(self) -> str | None:
        return next((k for k in self._slot_of if not self._pins.get(k)), None)

    def can_acquire(self, key: str) -> bool:
        return key in self._slot_of or self.free_slots() > 0 or self._victim() is not None

    def acquire(self, source: AdapterSource) -> int | None:
        """Pin ``source`` in a slot, loading it (and evicting the least recently used unpinned
        adapter) if needed; None when every slot is pinned. Raises ``AdapterError`` for an
        adapter that cannot be served; the cache is then unchanged."""
        key = source.key
        slot = self._slot_of.get(key)
        if slot is None:
            if not self.can_acquire(key):
                return None
            # Read and checked before evicting anything: a bad adapter costs no slot.
            weights = self.reader(source)
            self.slots.check(weights)
            used = set(self._slot_of.values())
            free = [s for s in range(1, self.capacity + 1) if s not in used]
            if free:
                slot = free[0]
            else:
                victim = self._victim()
                assert victim is not None  # can_acquire said so
                slot = self._slot_of.pop(victim)
                self._pins.pop(victim, None)
                self.evictions += 1
                log.info("adapter %s evicted from slot %d for %s", victim, slot, key)
            self.slots.write(slot, weights)
            self._slot_of[key] = slot
            self.loads += 1
            log.info("adapter %s loaded into slot %d", key, slot)
        self._slot_of.move_to_end(key)
        self._pins[key] = self._pins.get(key, 0) + 1
        return slot

    def release(self, key: str) -> None:
        count = self._pins.get(key, 0) - 1
        if count > 0:
            self._pins[key] = count
        else:
            self._pins.pop(key, None)
