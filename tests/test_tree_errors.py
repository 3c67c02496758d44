"""Bad input to `RadixTree` gets a typed error and leaves the tree unchanged.

Each case runs against a populated tree (FULL only, and FULL + SWA): a branch, a
locked node, a stored node, an offload in flight. After the refused call,
`tree.check()` passes and a snapshot of every node (ids, keys, slots, residency,
lock_refs, hit counts, hashes) and of the allocator (free pages, SWA mapping) is
identical to the one taken before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch

from tree_strategies import key_of, request_slots, serve, tree_snapshot
from unicache_fsm.fsm.errors import IllegalTransitionError, UnicacheFsmError
from unicache_fsm.pools import HostKVPool, KVPool, PagedAllocator, SWAAllocator
from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree import (
    EvictParams,
    InsertParams,
    LockUnderflowError,
    NodeStateError,
    OffloadTicket,
    OwnedSlotsError,
    RadixTree,
    ResidencyTrigger,
    SlotTensorError,
    TreeConfig,
    TreeConfigError,
    TreeError,
    TreeNode,
    UnalignedKeyError,
    ValueLengthError,
)

FULL, SWA = ComponentType.FULL, ComponentType.SWA

P = 4


@attrs.define
class Scene:
    """A populated tree and handles into it."""

    tree: RadixTree = attrs.field(repr=False)
    key: tuple[int, ...]
    leaf: TreeNode = attrs.field(repr=False)  # [8, 16) under [0, 8), unlocked, unstored
    locked: TreeNode = attrs.field(repr=False)  # a locked leaf on another branch
    stored: TreeNode = attrs.field(repr=False)  # a stored node
    ticket: OffloadTicket = attrs.field(repr=False)  # an offload in flight over `shipping`
    shipping: TreeNode = attrs.field(repr=False)
    # slots a request allocated for an insert that has not happened (yet)
    outside_full: list[torch.Tensor] = attrs.field(factory=list, repr=False)
    outside_swa: list[torch.Tensor] = attrs.field(factory=list, repr=False)

    def check(self) -> None:
        self.tree.check({FULL: self.outside_full, SWA: self.outside_swa})


def populate(tree: RadixTree) -> Scene:
    key = key_of(16)
    serve(tree, key[:8])
    leaf = serve(tree, key).last_device_node
    locked = serve(tree, key[:8] + (50,) * 8).last_device_node
    stored = serve(tree, (60,) * 8).last_device_node
    shipping = serve(tree, (70,) * 12).last_device_node
    assert leaf is not None and locked is not None
    assert stored is not None and shipping is not None
    tree.inc_lock_ref(locked)
    tree.finish_offload(tree.begin_offload(tree.offload_chain(stored)), True)
    ticket = tree.begin_offload(tree.offload_chain(shipping))
    tree.check()
    return Scene(tree, key, leaf, locked, stored, ticket, shipping)


def full_scene() -> Scene:
    return populate(RadixTree(PagedAllocator(64 * P, P)))


def swa_scene() -> Scene:
    alloc = SWAAllocator(64 * P, 64 * P, P)
    return populate(RadixTree(alloc, TreeConfig(sliding_window_size=2 * P)))


def host_scene() -> Scene:
    alloc = PagedAllocator(64 * P, P)
    kv = KVPool.for_allocator(alloc, num_layers=1, width=2, dtype=torch.float32)
    tree = RadixTree(
        alloc,
        kv_pool=kv,
        host_pool=HostKVPool.for_device_pool(kv, 64 * P),
        host_allocator=PagedAllocator(64 * P, P),
    )
    return populate(tree)


SCENES = {"full": full_scene, "swa": swa_scene, "host": host_scene}


@pytest.fixture(params=sorted(SCENES))
def scene(request: pytest.FixtureRequest) -> Scene:
    return SCENES[request.param]()


def refused(
    scene: Scene, error: type[Exception], call: Callable[..., Any], *args: Any
) -> Exception:
    """`call(*args)` raises exactly `error`; the tree and its pools are unchanged."""
    tree = scene.tree
    before = tree_snapshot(tree)
    with pytest.raises(error) as info:
        call(*args)
    assert type(info.value) is error, f"expected {error.__name__}, got {info.value!r}"
    assert tree_snapshot(tree) == before, "a refused call changed the tree"
    scene.check()
    return info.value


def insert_params(scene: Scene, **changes: Any) -> InsertParams:
    """A valid insert of the scene's key extended by two pages, then `changes`."""
    tree = scene.tree
    key = (*scene.key, 80, 80, 80, 80, 81, 81, 81, 81)
    m = tree.match_prefix(key)
    fresh, fresh_swa = request_slots(tree.allocator, m.prefix_len, len(key))
    scene.outside_full.append(fresh)
    scene.outside_swa.append(fresh_swa)
    params = InsertParams(key, torch.cat([m.device_indices, fresh]), prev_prefix_len=m.prefix_len)
    return attrs.evolve(params, **changes)


# -- insert ---------------------------------------------------------------------------


def test_valid_insert_params_are_accepted(scene: Scene) -> None:
    """The baseline the bad cases below vary: it inserts fine."""
    params = insert_params(scene)
    result = scene.tree.insert(params)
    assert result.prefix_len == 16 and result.last_device_node is not None
    scene.tree.check()  # the tree adopted the request's slots


def test_unaligned_key_length(scene: Scene) -> None:
    params = insert_params(scene)
    longer = torch.cat([params.value, params.value[:1]])
    bad = attrs.evolve(params, key=(*params.key, 1), value=longer)
    err = refused(scene, UnalignedKeyError, scene.tree.insert, bad)
    assert isinstance(err, UnalignedKeyError) and (err.value, err.page_size) == (25, P)


def test_value_length_differs_from_key_length(scene: Scene) -> None:
    params = insert_params(scene)
    bad = attrs.evolve(params, value=params.value[:-P])
    err = refused(scene, ValueLengthError, scene.tree.insert, bad)
    assert isinstance(err, ValueLengthError) and (err.key_len, err.value_len) == (24, 20)


@pytest.mark.parametrize(
    "convert",
    [
        pytest.param(lambda v: v.to(torch.int32), id="int32"),
        pytest.param(lambda v: v.to(torch.float64), id="float64"),
        pytest.param(lambda v: v.view(2, -1), id="2-D"),
        pytest.param(lambda v: v[0], id="0-D"),
        pytest.param(lambda v: v.tolist(), id="list"),
        pytest.param(lambda v: torch.empty(v.shape, dtype=torch.int64, device="meta"), id="meta"),
    ],
)
def test_bad_slot_tensor(scene: Scene, convert: Callable[[torch.Tensor], Any]) -> None:
    params = insert_params(scene)
    bad = attrs.evolve(params, value=convert(params.value))
    refused(scene, SlotTensorError, scene.tree.insert, bad)


@pytest.mark.parametrize("field", ["prev_prefix_len", "swa_evicted_seqlen"])
def test_unaligned_prefix_lengths(scene: Scene, field: str) -> None:
    bad = insert_params(scene, **{field: 6})
    err = refused(scene, UnalignedKeyError, scene.tree.insert, bad)
    assert isinstance(err, UnalignedKeyError) and (err.what, err.value) == (field, 6)


@pytest.mark.parametrize("value", [-4, 28])
def test_prefix_length_outside_the_key(scene: Scene, value: int) -> None:
    bad = insert_params(scene, prev_prefix_len=value)
    tree = scene.tree
    before = tree_snapshot(tree)
    with pytest.raises(TreeError) as info:
        tree.insert(bad)
    assert isinstance(info.value, ValueError)
    assert tree_snapshot(tree) == before
    scene.check()


def test_unaligned_slots_are_refused() -> None:
    scene = full_scene()
    tree = scene.tree
    free_page = int(tree.allocator.free_page_ids()[0])
    bad = torch.arange(free_page * P + 1, free_page * P + 1 + P)  # straddles two pages
    before = tree_snapshot(tree)
    with pytest.raises(UnicacheFsmError):
        tree.insert(InsertParams((90,) * P, bad))
    assert tree_snapshot(tree) == before


def test_unallocated_slots_are_refused() -> None:
    scene = full_scene()
    tree = scene.tree
    free_page = int(tree.allocator.free_page_ids()[-1])
    before = tree_snapshot(tree)
    with pytest.raises(UnicacheFsmError):
        tree.insert(InsertParams((90,) * P, torch.arange(free_page * P, free_page * P + P)))
    assert tree_snapshot(tree) == before


def test_unallocated_duplicate_slots_are_refused_before_any_change() -> None:
    scene = full_scene()
    tree = scene.tree
    params = insert_params(scene, prev_prefix_len=8)  # value[8:16] duplicates the tree's
    value = params.value.clone()
    free_page = int(tree.allocator.free_page_ids()[-1])
    value[8:12] = torch.arange(free_page * P, free_page * P + P)
    before = tree_snapshot(tree)
    with pytest.raises(UnicacheFsmError):
        tree.insert(attrs.evolve(params, value=value))
    assert tree_snapshot(tree) == before


def test_slots_another_node_owns_are_refused_in_a_new_leaf(scene: Scene) -> None:
    """Issue 12 item 8: slots the tree already owns (another node's), passed past
    `prev_prefix_len` under a different key, are refused before any change; accepted,
    two keys would share pages and a later eviction would free them twice."""
    tree = scene.tree
    owned = tree.path_slots(scene.stored)[-P:]  # a page of a node off the insert's path
    params = insert_params(scene)  # value[m:] = fresh slots for two new pages
    value = params.value.clone()
    value[-P:] = owned
    err = refused(scene, OwnedSlotsError, tree.insert, attrs.evolve(params, value=value))
    assert isinstance(err, OwnedSlotsError) and isinstance(err, ValueError)
    assert err.pages == [int(owned[0]) // P] and err.node_ids == [scene.stored.id]


def test_matched_slots_past_prev_prefix_len_are_refused(scene: Scene) -> None:
    """The same mistake on the matched path: the tree's own slots declared the caller's
    (prev_prefix_len 0) would be freed as duplicates while the tree keeps them."""
    tree = scene.tree
    params = insert_params(scene, prev_prefix_len=0)
    err = refused(scene, OwnedSlotsError, tree.insert, params)
    assert isinstance(err, OwnedSlotsError)
    expected = tree.match_prefix(params.key).device_indices[::P] // P
    assert err.pages == sorted(expected.tolist())
    assert scene.leaf.id in err.node_ids


# -- split ----------------------------------------------------------------------------


def test_split_at_an_unaligned_position(scene: Scene) -> None:
    refused(scene, UnalignedKeyError, scene.tree.split, scene.leaf, 2)


@pytest.mark.parametrize("k", [0, 8, 12])
def test_split_outside_the_node(scene: Scene, k: int) -> None:
    refused(scene, TreeError, scene.tree.split, scene.leaf, k)


def test_split_the_root(scene: Scene) -> None:
    refused(scene, TreeError, scene.tree.split, scene.tree.root, P)


def test_split_of_deleted_node_is_refused() -> None:
    tree = RadixTree(PagedAllocator(16 * P, P))
    node = serve(tree, key_of(2 * P)).last_device_node
    assert node is not None
    tree.evict(EvictParams(num_tokens=2 * P))
    assert not node.device_resident and not node.evicted  # deleted
    before = tree_snapshot(tree)
    with pytest.raises(NodeStateError):
        tree.split(node, P)
    assert tree_snapshot(tree) == before
    tree.check()


# -- locks ----------------------------------------------------------------------------


def test_unlock_an_unlocked_node(scene: Scene) -> None:
    err = refused(scene, LockUnderflowError, scene.tree.dec_lock_ref, scene.leaf)
    assert isinstance(err, LockUnderflowError)


def test_unlock_below_a_lock_elsewhere(scene: Scene) -> None:
    """[0, 8) is locked (through `locked`), its other child is not: nothing changes."""
    assert scene.leaf.parent is not None and scene.leaf.parent.lock_ref == 1
    refused(scene, LockUnderflowError, scene.tree.dec_lock_ref, scene.leaf)


def test_lock_a_deleted_node(scene: Scene) -> None:
    tree = scene.tree
    tree.evict(EvictParams(num_tokens=1000))
    assert scene.leaf.residency.startswith("device.deleted")
    refused(scene, NodeStateError, tree.inc_lock_ref, scene.leaf)
    refused(scene, NodeStateError, tree.dec_lock_ref, scene.leaf)


# -- offloads and residency -----------------------------------------------------------


def test_offload_a_stored_node(scene: Scene) -> None:
    refused(scene, NodeStateError, scene.tree.begin_offload, [scene.stored])


def test_offload_an_offloading_node(scene: Scene) -> None:
    refused(scene, NodeStateError, scene.tree.begin_offload, [scene.shipping])


def test_offload_chain_not_root_first(scene: Scene) -> None:
    leaf = scene.leaf
    assert leaf.parent is not None
    refused(scene, NodeStateError, scene.tree.begin_offload, [leaf, leaf.parent])


def test_offload_an_empty_chain(scene: Scene) -> None:
    refused(scene, TreeError, scene.tree.begin_offload, [])


def test_offload_without_hashes() -> None:
    tree = RadixTree(PagedAllocator(16 * P, P), TreeConfig(hash_pages=False))
    node = serve(tree, key_of(2 * P)).last_device_node
    assert node is not None
    scene = Scene(tree, (), node, node, node, OffloadTicket(0, node, []), node)  # one node
    refused(scene, NodeStateError, tree.begin_offload, [node])


def test_finish_an_offload_twice(scene: Scene) -> None:
    scene.tree.finish_offload(scene.ticket, True)
    refused(scene, TreeError, scene.tree.finish_offload, scene.ticket, False)


def test_mark_stored_path_with_an_anchor_off_the_path(scene: Scene) -> None:
    refused(scene, NodeStateError, scene.tree.mark_stored_path, scene.leaf, scene.locked)


@pytest.mark.parametrize(
    "trigger",
    [
        ResidencyTrigger.OFFLOAD_SUCCEEDED,
        ResidencyTrigger.OFFLOAD_FAILED,
        ResidencyTrigger.DEMOTE,
        ResidencyTrigger.LOAD_BACK,
        ResidencyTrigger.UNEVICT,
        ResidencyTrigger.BACKUP_SUCCEEDED,
        ResidencyTrigger.DROP_BACKUP,
    ],
)
def test_illegal_residency_trigger(scene: Scene, trigger: ResidencyTrigger) -> None:
    """An unstored, resident, un-backed node allows none of these."""
    err = refused(scene, IllegalTransitionError, scene.tree.residency.fire, scene.leaf, trigger)
    assert isinstance(err, IllegalTransitionError) and err.trigger == trigger.value


def test_evict_an_offloading_node_by_trigger(scene: Scene) -> None:
    refused(scene, IllegalTransitionError, scene.tree.residency.fire, scene.shipping, "delete")


def test_drop_a_backup_that_does_not_exist() -> None:
    scene = host_scene()
    refused(scene, IllegalTransitionError, scene.tree.drop_backup, scene.leaf)


def test_host_tier_calls_without_a_host_tier() -> None:
    scene = full_scene()
    refused(scene, TreeError, scene.tree.backup, scene.leaf)


# -- construction ---------------------------------------------------------------------


def test_swa_allocator_needs_a_window() -> None:
    with pytest.raises(TreeError):
        RadixTree(SWAAllocator(16, 16, 4))
    with pytest.raises(TreeError):
        RadixTree(PagedAllocator(16, 4), TreeConfig(sliding_window_size=4))


@pytest.mark.parametrize("size", [0, -1, -2 * P, 2.5, True, "8"])
def test_sliding_window_size_must_be_a_positive_int(size: Any) -> None:
    """Issue 12 item 9: a window of 0 tokens (or less, or not an int) is refused with
    a typed error naming the field (0 would mean "every page" in the SWA LOOKUP)."""
    with pytest.raises(TreeConfigError) as info:
        RadixTree(SWAAllocator(16 * P, 16 * P, P), TreeConfig(sliding_window_size=size))
    err = info.value
    assert isinstance(err, TreeError) and isinstance(err, ValueError)
    assert (err.what, err.value) == ("sliding_window_size", size)


def test_swa_eviction_on_a_full_only_tree() -> None:
    scene = full_scene()
    tree = scene.tree
    before = tree_snapshot(tree)
    try:
        result = tree.evict(EvictParams(swa_num_tokens=4 * P))
    except TreeError:
        pass
    else:
        assert result.swa_num_tokens == 0
    assert tree_snapshot(tree) == before
