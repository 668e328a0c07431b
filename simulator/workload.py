"""Agentic multi-turn requests: sessions sharing a system prompt, each growing turn by turn.

Imports nothing but the standard library: it makes token ids, never events or sockets.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Request:
    """One turn of a session: its whole context so far (prompt plus the generated reply)."""

    session_id: str
    turn: int
    token_ids: list[int]
    last: bool
    """The session finishes after this turn (a router may forget it)."""


@dataclass(slots=True)
class _Session:
    session_id: str
    turns: int
    context: list[int]
    turn: int = 0


@dataclass(slots=True)
class AgenticWorkload:
    """Deterministic stream of agent turns over a rolling set of concurrent sessions.

    Every session opens with one of `system_prompts` shared prompts (`system_prompt_blocks`
    full blocks), then each turn appends a user or tool message and the model's reply to its
    context: consecutive turns share their prefix, so an engine sees prefix hits and, in
    report mode "full", reuse reports. A finished session is replaced by a new one, so
    sessions start and finish over time while `sessions` stay active. Same seed, same stream.
    """

    sessions: int = 8
    """Concurrently active sessions."""
    seed: int = 0
    block_size: int = 16
    system_prompt_blocks: int = 4
    """Full blocks of the shared system prompt (a prefix every session holds)."""
    system_prompts: int = 1
    """Distinct system prompts (agent kinds); each session draws one."""
    turns: tuple[int, int] = (3, 12)
    """Inclusive range of a session's number of turns."""
    message_tokens: tuple[int, int] = (8, 64)
    """Inclusive range of tokens a user or tool message adds per turn."""
    reply_tokens: tuple[int, int] = (8, 48)
    """Inclusive range of tokens the model's reply adds per turn."""
    max_context_tokens: int = 4096
    """A session ends early rather than grow past this (the engine's pool must hold it)."""
    total_sessions: int | None = None
    """Sessions to start in all; None: endless (a finished one is always replaced)."""
    vocab_size: int = 32_000
    _rng: random.Random = field(init=False, repr=False)
    _prompts: list[list[int]] = field(init=False, repr=False)
    _active: list[_Session] = field(init=False, repr=False)
    _started: int = field(init=False, default=0)
    _finished: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")
        prompt_len = self.system_prompt_blocks * self.block_size
        if prompt_len + self.message_tokens[1] + self.reply_tokens[1] > self.max_context_tokens:
            raise ValueError("max_context_tokens cannot hold the system prompt and one turn")
        self._rng = random.Random(self.seed)
        self._prompts = [self._tokens(prompt_len) for _ in range(self.system_prompts)]
        self._active = []
        while len(self._active) < self.sessions and self._may_start():
            self._start()

    @property
    def max_context_blocks(self) -> int:
        """Most full blocks one request can have: the pool size an engine needs at least."""
        return self.max_context_tokens // self.block_size

    @property
    def active_sessions(self) -> list[str]:
        """Ids of the sessions that will have more turns."""
        return [s.session_id for s in self._active]

    @property
    def started_sessions(self) -> int:
        return self._started

    @property
    def finished_sessions(self) -> int:
        return self._finished

    def next_request(self) -> Request | None:
        """The next turn of a randomly chosen active session; None once all have finished."""
        if not self._active:
            return None
        index = self._rng.randrange(len(self._active))
        session = self._active[index]
        session.context.extend(self._tokens(self._rng.randint(*self.message_tokens)))
        session.context.extend(self._tokens(self._rng.randint(*self.reply_tokens)))
        session.turn += 1
        room = self.max_context_tokens - len(session.context)
        last = session.turn >= session.turns or room < self.message_tokens[1] + self.reply_tokens[1]
        request = Request(session.session_id, session.turn, list(session.context), last)
        if last:
            self._active.pop(index)
            self._finished += 1
            if self._may_start():
                self._start()
        return request

    def __iter__(self) -> Iterator[Request]:
        while (request := self.next_request()) is not None:
            yield request

    def _may_start(self) -> bool:
        return self.total_sessions is None or self._started < self.total_sessions

    def _start(self) -> None:
        prompt = self._prompts[self._rng.randrange(len(self._prompts))]
        session_id = f"sess-{self._started:05d}"
        self._active.append(_Session(session_id, self._rng.randint(*self.turns), list(prompt)))
        self._started += 1

    def _tokens(self, n: int) -> list[int]:
        # Ids below 100 are left out: real vocabularies keep them for special tokens.
        return [self._rng.randrange(100, self.vocab_size) for _ in range(n)]
