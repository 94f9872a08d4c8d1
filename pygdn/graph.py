"""Recording a step's calls once and replaying them (include/gdn_xpu.h "Graphs", docs/usage.md
"Graphs"): the gdn_graph_* entry points for dpctl queues, which have no graph API of their own.
torch-XPU records pygdn's calls with its own graph capture instead (torch.xpu.XPUGraph).

    with pygdn.Graph(q) as graph:   # q: an in-order queue; its commands are recorded, not run
        step(wait=False)            # pygdn calls with batch.validate == "counts"
    graph.replay()                  # the recorded calls on what the arrays hold now
"""
from __future__ import annotations

from ._lib import ffi as _ffi, lib as _lib
from ._usm import as_queue as _as_queue
from ._c import check as _check

_VOIDP = _ffi.typeof("void *")


class Graph:
    """The commands submitted to an in-order queue between entering and leaving the `with` block,
    recorded into a SYCL command graph (gdn_graph_begin / gdn_graph_end) and replayed by replay().

    Inside the block nothing runs and nothing may wait on the queue: pygdn's calls skip their wait
    there; queue.wait() is a SYCL error, which dpctl turns into an abort. Every command submitted
    to the queue is recorded, a copy too (UsmArray.from_numpy, copy_from, to_numpy, dpnp.asarray):
    it would copy from or to its host buffer at every replay, long after that buffer is gone, so
    make and fill arrays before recording. What the graph holds is fixed at recording: the
    config, the batch counts and every array's address, so keep every array of the recorded calls
    alive, at its address, for as long as the graph may be replayed; between replays write new
    contents into them (inputs, caches, metadata). Graph(q, keep=[...]) (or graph.keep) holds
    objects for the graph's life."""

    def __init__(self, queue, keep=()):
        self.queue = _as_queue(queue)
        self._qp = _ffi.cast(_VOIDP, self.queue.addressof_ref())
        self._graph = None
        self._ended = False
        self.keep = list(keep)

    def __enter__(self) -> "Graph":
        if self._graph is not None:
            raise RuntimeError("pygdn.Graph: already recorded (make a new Graph to record again)")
        out = _ffi.new("gdn_graph_t **")
        _check(_lib.gdn_graph_begin(self._qp, out))
        self._graph = _ffi.gc(out[0], _lib.gdn_graph_destroy)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:  # a failed recording is dropped (its recording ended)
            graph, self._graph = self._graph, None
            _ffi.release(graph)
            return False
        _check(_lib.gdn_graph_end(self._graph))
        self._ended = True
        return False

    def replay(self, queue=None, wait: bool = True) -> None:
        """Run the recorded commands on queue (default: the recording queue; another in-order
        queue of its context and device), after the work already there; wait=True waits for them."""
        if not self._ended:
            raise RuntimeError("pygdn.Graph.replay: nothing recorded yet (record inside `with graph:`)")
        q = self.queue if queue is None else _as_queue(queue)
        _check(_lib.gdn_graph_replay(self._qp if queue is None else _ffi.cast(_VOIDP, q.addressof_ref()), self._graph))
        if wait:
            q.wait()

    def __repr__(self):
        state = "recorded" if self._ended else "recording" if self._graph is not None else "empty"
        return f"<pygdn.Graph {state}>"


def recording(queue) -> bool:
    """Whether the queue records into a graph now (any graph: pygdn.Graph's, torch's, the caller's own)."""
    q = _as_queue(queue)
    return bool(_lib.gdn_queue_recording(_ffi.cast(_VOIDP, q.addressof_ref())))
