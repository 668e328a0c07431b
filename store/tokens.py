"""Dynamo's view of one worker's entries: each block's parent and the hash of its tokens.

Imports the store model only; no I/O. Dynamo's indexer keys a block by its tokens' hash
(hashing/dynamo.py) under its parent, so a prompt matches along a path of such hashes from
the root (its radix tree). `TokenTree` keeps that path per worker, next to the engine's block
hashes the index already keys by: an edge (parent block hash, tokens hash) -> block hash,
added when a store names the tokens, dropped when no part of the worker holds the block
any more. A walk of a prompt's tokens hashes then gives the engine hashes the index matches
(`store.memory`, the Redis writer's mirror; Redis keeps the edges in `P:{W}:tk`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvsi.store.model import Hash

Edge = tuple[int | None, int]
"""(parent block hash or None at a prompt's start, tokens hash): where a block hangs."""


class TokenTree:
    """One worker's edges: (parent, tokens hash) -> block, and each block's edge.

    Only u64 block hashes (Dynamo's type): a store naming a digest adds nothing. Two blocks
    with one edge (the same tokens after the same parent: an engine salting what Dynamo
    cannot see) keep the edge on the last stored, as Dynamo's tree keeps one node.
    """

    __slots__ = ("child", "edge")

    def __init__(self) -> None:
        self.child: dict[Edge, int] = {}
        self.edge: dict[int, Edge] = {}

    def __len__(self) -> int:
        return len(self.edge)

    def link(
        self, parent: Hash | None, hashes: Sequence[Hash], tokens: Sequence[int]
    ) -> list[tuple[int, Edge]]:
        """Hang `hashes` (a store's blocks, in order) under `parent` by their tokens hashes;
        returns the edges added (a block already linked keeps its edge)."""
        added: list[tuple[int, Edge]] = []
        if parent is not None and not isinstance(parent, int):
            return added
        child, edge = self.child, self.edge
        for h, t in zip(hashes, tokens, strict=False):
            if h not in edge:
                if not isinstance(h, int):
                    return added
                key = (parent, t)
                edge[h] = key
                child[key] = h
                added.append((h, key))
            parent = h
        return added

    def unlink(
        self, hashes: Iterable[Hash], held: Callable[[Hash], bool]
    ) -> list[tuple[int, Edge]]:
        """Drop the edges of `hashes` the worker no longer holds (`held` false); returns
        those no other block kept (what Redis' edge hash loses)."""
        gone: list[tuple[int, Edge]] = []
        edge, child = self.edge, self.child
        for h in hashes:
            if not isinstance(h, int):
                continue
            key = edge.get(h)
            if key is None or held(h):
                continue
            del edge[h]
            if child.get(key) == h:
                del child[key]
                gone.append((h, key))
        return gone

    def walk(self, tokens: Iterable[int]) -> list[int]:
        """The blocks along `tokens` from the root, as far as an edge goes."""
        path: list[int] = []
        child = self.child
        parent: int | None = None
        for t in tokens:
            h = child.get((parent, t))
            if h is None:
                break
            path.append(h)
            parent = h
        return path

    def load(self, edges: Iterable[tuple[Edge, int]]) -> None:
        """Add edges as Redis keeps them (a writer's load)."""
        for key, h in edges:
            self.child[key] = h
            self.edge[h] = key

    def clear(self) -> None:
        self.child.clear()
        self.edge.clear()
