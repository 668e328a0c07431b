"""Per-request extra keys of vLLM 0.33's block hashes: LoRA, multimodal items, salt, embeddings.

Imports the standard library and hashing.serialize only (no torch, no NumPy: embeddings come in
as a memoryview).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kvsi.hashing.serialize import HashValue

_MM_TAG = "mm"
"""One str object for every multimodal entry, as in vLLM: with pickle's memo by identity, the
second and later "mm" of a payload become back-references (HASHING.md §3.1)."""


def _own_copy(text: str) -> str:
    """An equal str object that no other value of the payload shares.

    vLLM's LoRA names and paths, salts and multimodal identifiers are decoded separately, so
    pickle writes each in full even when two are equal; a caller may pass one object twice.
    Decoding a copy also keeps CPython's sharing of empty and one-character strings, which
    vLLM's values have too.
    """
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _check_int(name: str, value: object, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_str(name: str, value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"{name} must be a str, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class MMFeature:
    """One multimodal item: its hash identifier and its placeholder tokens `[offset, +length)`.

    `identifier` is vLLM's `mm_feature.identifier`: the item's hash string, with the LoRA
    prefix vLLM adds when applicable. Construction validates the fields.
    """

    identifier: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        _check_str("MMFeature.identifier", self.identifier)
        _check_int("MMFeature.offset", self.offset, 0)
        _check_int("MMFeature.length", self.length, 1)


class RequestKeys:
    """What besides its tokens a request's block hashes depend on (HASHING.md §5).

    Built once per request (validated here), then asked for each block's keys. Instances are
    read-only by convention and may be reused across calls.
    """

    __slots__ = ("_embeds", "_embeds_row_bytes", "_embeds_rows", "_lora", "_mm", "_salt")

    def __init__(
        self,
        *,
        lora_name: str | None = None,
        lora_path: str | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[MMFeature] = (),
        prompt_embeds: memoryview | None = None,
    ) -> None:
        """Validate the request's keys and prepare the objects that get hashed.

        `lora_path` is the path the adapter was registered with; it is hashed but never
        published, so a consumer must know it from the deployment. An empty `cache_salt`
        adds nothing (as in vLLM). `mm_features` are hashed in prompt order (sorted by
        offset here). `prompt_embeds` is a C-contiguous memoryview whose first dimension is
        the token position (e.g. `memoryview(tensor.numpy())`; view bfloat16 as int16 first),
        holding the raw bytes vLLM digests.
        """
        if (lora_name is None) != (lora_path is None):
            raise ValueError(
                "lora_name and lora_path go together: vLLM hashes the adapter's name and "
                f"path on every block (got lora_name={lora_name!r}, lora_path={lora_path!r})"
            )
        self._lora: tuple[str, str, str] | None = None
        if lora_name is not None and lora_path is not None:
            self._lora = (
                "lora",
                _own_copy(_check_str("lora_name", lora_name)),
                _own_copy(_check_str("lora_path", lora_path)),
            )
        self._salt: tuple[str, str] | None = None
        if cache_salt is not None and _check_str("cache_salt", cache_salt):
            self._salt = ("cache_salt", _own_copy(cache_salt))
        for feature in mm_features:
            if not isinstance(feature, MMFeature):
                raise ValueError(f"mm_features must hold MMFeature values, got {feature!r}")
        self._mm = [
            (feature.offset, feature.offset + feature.length, _own_copy(feature.identifier))
            for feature in sorted(mm_features, key=lambda feature: feature.offset)
        ]
        self._embeds: memoryview | None = None
        self._embeds_rows = self._embeds_row_bytes = 0
        if prompt_embeds is not None:
            if not isinstance(prompt_embeds, memoryview):
                raise ValueError(
                    f"prompt_embeds must be a memoryview, got {type(prompt_embeds).__name__}"
                )
            if prompt_embeds.ndim < 1 or not prompt_embeds.c_contiguous:
                raise ValueError(
                    "prompt_embeds must be C-contiguous with the token position as its first "
                    "dimension: vLLM digests the rows' raw bytes in that layout"
                )
            self._embeds = prompt_embeds.cast("B")
            self._embeds_rows = len(prompt_embeds)
            self._embeds_row_bytes = prompt_embeds.nbytes // max(self._embeds_rows, 1)

    @property
    def embedding_rows(self) -> int:
        """Token positions covered by the prompt embeddings (0 without them)."""
        return self._embeds_rows

    def __bool__(self) -> bool:
        return bool(self._lora or self._mm or self._salt or self._embeds is not None)

    def for_window(self, start: int, end: int) -> tuple[HashValue, ...] | None:
        """The extra keys of the block whose window is tokens `[start, end)`.

        The window is the block itself, or the block plus its lookahead tokens (§6). Entries
        come in vLLM's order: LoRA, multimodal items overlapping the window (offset relative
        to `start`, negative if the item began earlier), salt (first block only), embeddings
        digest (rows past the embeddings are absent from the slice, as in vLLM's slicing).
        """
        entries: list[HashValue] = []
        if self._lora is not None:
            entries.append(self._lora)
        for offset, stop, identifier in self._mm:
            if offset >= end:
                break
            if stop > start:
                entries.append((_MM_TAG, identifier, offset - start))
        if self._salt is not None and start == 0:
            entries.append(self._salt)
        if self._embeds is not None:
            rows = self._embeds[start * self._embeds_row_bytes : end * self._embeds_row_bytes]
            entries.append(("prompt_embeds", hashlib.sha256(rows).digest()))
        return tuple(entries) if entries else None
