"""``bia serve``: the experiment's torch model behind an OpenAI-compatible ``/v1/chat/completions``,
with continuous batching, so a probe has a real server to measure on this machine.

Continuous batching: requests that arrive while others decode are prefilled alone and join the
next decode step. In the ``default`` kernel mode the step runs every active row through each
layer together (KV caches left-padded to the longest), so a row's bits depend on its batch; in
``one-by-one`` mode (alias ``batch-invariant``) each row steps as its own batch of one; in
``fixed-tiles`` mode the step runs every active row together on fixed row tiles and attention
splits (``analysis.experiment.model.kernels``), so the batch is kept and a row's bits are still those
it would have alone; ``row-invariant`` mode does the same on GEMMs whose per-row order does not
depend on the row count (``analysis.experiment.model.rowwise``), at about the default mode's cost. Each step logs one line in
aprender's form, ``[PMAT-044] Batch m=N done in X ms (Y tok/s/slot)``, which both bia's probe and
aprender's read. Streams declare ``"stream_mode": "live"`` and carry logprobs with top_logprobs; a response's last
chunk (or the whole response) carries the request's ``timings`` in llama.cpp's fields (:func:`timings`).
"""

from ._app import REQUESTS as REQUESTS
from ._app import create_app
from ._engine import LOG as LOG
from ._engine import MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS
from ._engine import Engine, timings
from ._server import BackgroundServer, serve

__all__ = ["BackgroundServer", "Engine", "create_app", "serve", "timings"]
