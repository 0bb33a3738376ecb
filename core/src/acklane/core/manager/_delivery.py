"""Inline delivery: an inline member's filter evaluated by the broadcast itself.

No queue, task or generator of the member's own: the group opens its window, calls
its filter, binds and emits each payload, and closes the window, by the same rules
as a queued member pulling the raw event.
"""

from __future__ import annotations

from typing import Any

from ..trigger import current_window
from ._common import log
from ._hooks import Received, verdict_of
from ._ledger import ACKED, FAILED, _Entry
from ._members import _Members
from ._subscriber import _Subscriber
from ._types import Rejected, _new_tuple


class _Delivery(_Members):
    """Inline members' evaluation, entry by entry and member by member."""

    def _deliver_inline_run(self, entries: list[_Entry], inline: tuple[_Subscriber, ...]) -> None:
        """Every entry of a run to every inline member of its snapshot, entry by entry
        (so that the members evaluating one message run one after the other: a body
        decoded once serves them all). A member failed on the way resolves the run's
        later entries as failed (they counted it); a failed group stops it all."""
        deliver = self._deliver_inline
        verdict_of = self._inline_verdict
        # (member, its evaluate, its emit) for the members evaluated here: not windowed
        plain = [
            (sub, sub.inline.evaluate, sub.inline.emit)
            for sub in inline
            if sub.inline is not None and not sub.inline.windowed
        ]
        bind = self.host.bind  # (a run is broadcast in ack mode only)
        windowed = [sub for sub in inline if sub.inline is not None and sub.inline.windowed]
        filtered = self.on_filtered  # (tracing's spans, or None)
        for entry in entries:
            raw = entry.raw
            empty = 0  # members on which nothing fired: acked together, after the loop
            for sub, evaluate, emit in plain:
                if sub.failure is not None or sub.closed:
                    self.resolve(entry, FAILED)
                    continue
                try:
                    verdict = evaluate(raw)
                except Exception as exc:  # the filter raised on this event
                    if filtered is not None:
                        self._inline_filtered(sub, entry, None)
                    sub.current = entry
                    self.force_fail(sub, exc, entry)
                    if self.frozen:
                        return  # the failure failed the group (the runner's observer)
                    continue
                if filtered is not None:
                    self._inline_filtered(sub, entry, verdict)
                if type(verdict) is list and not verdict:
                    empty += 1
                    continue
                if type(verdict) is list and len(verdict) == 1:
                    # _inline_verdict for one payload, without its call (a watcher that
                    # fires fires once, most often): bound, emitted, then the window
                    # closes, acked with the others when nothing awaits the store
                    sub.current = entry
                    try:
                        emit(verdict[0], bind(sub, entry))
                    except Exception as exc:  # the emitter's own error, not the message's
                        self.force_fail(sub, exc)
                        if self.frozen:
                            return
                        continue
                    if self.frozen:
                        return  # its emit failed the group: nothing more
                    if sub.current is not entry:
                        continue  # failed or closed by emit: that resolved it
                    binding = sub.binding
                    if not sub.rejected_current and (binding is None or binding.pending == 0):
                        sub.current = None
                        empty += 1
                    else:
                        sub.move_past()
                    continue
                verdict_of(sub, entry, verdict)
                if self.frozen:
                    return  # its emit failed the group: nothing more
            for sub in windowed:
                if sub.failure is None and not sub.closed:
                    deliver(sub, entry)
                    if self.frozen:
                        return
                else:
                    self.resolve(entry, FAILED)
            if empty:  # the members on which nothing fired, acked at once
                self.resolve(entry, ACKED, empty)

    def _deliver_inline(self, sub: _Subscriber, entry: _Entry) -> None:
        """One inline member takes one raw event: the window opens, the filter runs, each
        payload is bound and emitted, the window closes (acked once every emitted event
        is confirmed). The same rules as a queued member pulling it, in one call.

        This is the inline path's one per-(message, member) step: a hook that must see
        each evaluation (a tracing span) goes around the ``evaluate`` call here.
        """
        hooks = sub.inline
        assert hooks is not None
        windowed = hooks.windowed
        if windowed:  # the filter may reject through the window itself
            sub.current = entry
            if current_window.get() is not sub:
                current_window.set(sub)
        traced = self.on_filtered is not None
        try:
            verdict = hooks.evaluate(entry.raw)
        except Exception as exc:  # the filter raised on this event: a failed attempt
            if traced:
                self._inline_filtered(sub, entry, None)
            sub.current = entry
            self.force_fail(sub, exc, entry)
            return
        if traced:
            self._inline_filtered(sub, entry, verdict)
        if not windowed and type(verdict) is list and not verdict:
            # nothing fires (most evaluations, with many watchers): acked at once, no
            # window ever opened
            if self.acking:
                self.resolve(entry, ACKED)
            return
        self._inline_verdict(sub, entry, verdict)

    def _inline_verdict(self, sub: _Subscriber, entry: _Entry, verdict: Any) -> None:
        """What an inline member's filter decided on ``entry``, applied: rejected, or
        each payload bound and emitted, then the window closed."""
        hooks = sub.inline
        assert hooks is not None
        sub.current = entry
        if type(verdict) is not list:
            if isinstance(verdict, Rejected):
                if not sub.reject(verdict.reason) and not self.acking:
                    log.warning(
                        "reject_shared_stream_event() called outside a binding window; "
                        "ignored (fast path, standalone run(), or between two events)"
                    )
                sub.move_past()
                return
            self.force_fail(
                sub,
                TypeError(
                    f"trigger {sub.trigger_id}: an inline filter returns a list of "
                    f"payloads or Rejected, not {type(verdict).__name__}"
                ),
                entry,
            )
            return
        if verdict:
            emit = hooks.emit
            bind = self.host.bind if self.acking else None
            for payload in verdict:
                if sub.rejected_current:
                    break  # rejected (by the filter, or a payload that cannot be stored):
                    # what it returned beyond that is dropped, never bound to it
                try:
                    emit(payload, None if bind is None else bind(sub, entry))
                except Exception as exc:  # the emitter's own error, not the message's
                    self.force_fail(sub, exc)
                    return
                if sub.current is not entry:
                    break  # failed by emit
        if sub.current is entry:  # (else failed or closed meanwhile: that resolved it)
            sub.move_past()

    def _inline_filtered(self, sub: _Subscriber, entry: _Entry, verdict: Any) -> None:
        """Tell the hooks what an inline member's filter decided on ``entry`` (None: it
        raised), as a queued member's ``raw_stream`` does once its filter moves on."""
        on_filtered = self.on_filtered
        assert on_filtered is not None
        message = _new_tuple(Received, (entry.raw, entry.payload, None))
        on_filtered(self.key, message, verdict_of(sub.trigger_id, verdict))

    async def _inline_ready(self, inline: tuple[_Subscriber, ...]) -> None:
        """Wait while what an inline member emits into can take no more (back-pressure)."""
        for sub in inline:
            hooks = sub.inline
            ready = None if hooks is None or hooks.ready is None else hooks.ready()
            if ready is not None:
                self.stats.pauses += 1
                await ready
