"""With tracing on, every store call of a stream's batches is one `kvsi.apply` span naming
the worker, the first seq and how many batches it carried; with it off, none is made."""

from __future__ import annotations

from kvsi import tracing
from tests.subscriber.conftest import RigFactory
from tests.subscriber.peers import payload, stored
from tests.tracing import traced


async def test_each_apply_is_a_span_naming_worker_seq_and_batches(rig: RigFactory) -> None:
    with traced() as spans:
        r = await rig(replay=False)
        for n in range(3):
            await r.publisher.send(payload([stored([n])], rank=0))
        await r.applied_through(2)
        applies = [s for s in spans.get_finished_spans() if s.name == "kvsi.apply"]
    attributes = [dict(s.attributes or {}) for s in applies]
    assert {a["kvsi.worker"] for a in attributes} == {str(r.worker)}
    assert all(a["kvsi.applied"] is True and a["kvsi.mode"] == "live" for a in attributes)
    carried = [
        seq
        for a in attributes
        for seq in range(int(a["kvsi.seq"]), int(a["kvsi.seq"]) + int(a["kvsi.batches"]))
    ]
    assert carried == [0, 1, 2], "each batch in exactly one span, in seq order"
    assert tracing.tracer() is None, "off again after the test"
