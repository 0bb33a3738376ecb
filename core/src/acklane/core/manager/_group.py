"""One group: the live subscribers of a key, sharing one upstream poll; its lifecycle.

The group broadcasts each raw event to a snapshot of its members, keeps the ledger
of outstanding events per lane, hands resolved lane prefixes to the producer (the
pump), and fails members that sit on an event past the ack timeout (the sweep). One
module per concept, each a layer of the class (see ``_group_base``); this one runs
them: the group's task, its producer, stopping, failing, closing.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ._broadcast import _optional_hook
from ._common import log
from ._group_base import GroupSettings
from ._sweep import _Sweep


class GroupHost(GroupSettings, Protocol):
    """All a group uses of its manager: :class:`GroupSettings`, and three calls back
    (the manager's books of bindings and of live groups)."""

    def group_failed(self, group: _Group) -> None:
        """``group`` failed: it is no longer the key's live group (still closing)."""
        ...

    def group_ended(self, group: _Group) -> None:
        """``group``'s task is ending: its bindings will never resolve anything."""
        ...

    def group_done(self, group: _Group) -> None:
        """``group``'s task is done: it is no longer closing."""
        ...


class _Group(_Sweep):
    """All live subscribers of one key, sharing one upstream poll."""

    def __init__(self, host: GroupHost, *args: Any) -> None:
        """``host``, then :class:`~._group_base._GroupBase`'s arguments."""
        super().__init__(host, *args)
        #: the manager's books of bindings and live groups, behind three calls
        self.owner = host

    def start(self) -> None:
        """Run the group in its own task."""
        task = asyncio.get_running_loop().create_task(
            self._run(), name=f"acklane-group-{self.key!r}"
        )
        self._task = task
        # the manager keeps a closing group until its task is really done
        task.add_done_callback(lambda _t: self.owner.group_done(self))

    async def _run(self) -> None:
        """Build the producer, poll until stopped, advance until closed, then clean up.

        As in Airflow's manager, the group's own task polls and the pump and the sweep
        are its children: the first raw event is pulled in the step that built the
        producer (one event-loop turn after ``subscribe``), and a rejected or acked
        event is advanced as few turns after its broadcast as there.
        """
        if self._closing:
            return  # closed or failed before it ever ran: never connect
        if not self._create_producer():
            return
        try:
            async with asyncio.TaskGroup() as tg:
                if self.acking:
                    tg.create_task(self._advance_until_closed())
                await self._guarded_poll()
        except Exception as exc:  # a bug in the engine or an observer: fail loudly
            log.exception("Shared stream group key=%r crashed", self.key)
            self.fail(exc)
        finally:
            self.frozen = True
            await self._aclose_producer()
            self.owner.group_ended(self)

    async def _advance_until_closed(self) -> None:
        """The pump, with the sweep beside it until the pump is done."""
        async with asyncio.TaskGroup() as tg:
            sweep = tg.create_task(self._sweep())
            await self._pump()
            sweep.cancel()

    def _create_producer(self) -> bool:
        """Ack mode: build the producer from the founder's kwargs (False: the group failed)."""
        try:
            if self.acking:
                producer = self.trigger_cls.create_shared_stream_producer(self.kwargs)
                self.producer = producer
                self.message_id_of = _optional_hook(producer, "message_id")
        except Exception as exc:
            self.fail(exc)
            return False
        return True

    async def _guarded_poll(self) -> None:
        """The poll, turning its end or its error into the group's failure.

        It runs in the group's task; :meth:`stop_polling` stops it by cancelling that
        task while it polls, and only that cancellation is absorbed here (one from
        outside, by :meth:`abort` or the task's owner, goes on).
        """
        if not self._polling:
            return  # stopped before the group's task first ran
        task = asyncio.current_task()
        assert task is not None
        self._in_poll = True
        try:
            await self._poll()
        except asyncio.CancelledError:
            if not self._stop_requested:
                raise  # cancelled from outside, not by stop_polling()
            self._stop_requested = False
            if task.uncancel() > 0:
                raise  # and from outside as well
        except Exception as exc:
            self._in_poll = False  # over already: failing the group need not stop it
            self.fail(exc)
        finally:
            self._in_poll = False
            self._polling = False
            self._pump_wake.set()
        if self._stop_requested:
            # stop_polling() was called from this task's own poll step, which then
            # ended without awaiting again: its cancellation is still pending; take
            # it here, where it is known to be ours.
            self._stop_requested = False
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                if task.uncancel() > 0:
                    raise
            else:
                task.uncancel()  # swallowed on the way (by the producer): ours no more

    async def _aclose_producer(self) -> None:
        """Close the producer; a failure to is logged, never raised."""
        producer = self.producer
        if producer is None:
            return
        try:
            await producer.aclose()
        except Exception as exc:
            log.warning("Shared stream producer aclose failed key=%r: %r", self.key, exc)

    def fail(self, exc: BaseException) -> None:
        """The group fails loudly: every subscriber's iterator raises ``exc``."""
        if self.error is not None:
            return
        self.error = exc
        # DEBUG: every member's iterator raises exc, and its consumer tells it (the
        # runner in one restart line); a WARNING here said the same fault twice.
        log.debug("Shared stream group failed key=%r: %r", self.key, exc)
        self.owner.group_failed(self)
        self.close()
        for sub in self.members:
            sub.failure = exc
            sub.wake()
        self._set_members(())

    def close(self) -> None:
        """Stop for good: advance what is resolved now, abandon the rest, close the producer."""
        self.frozen = True
        self._closing = True
        self.stop_polling()
        self._pump_wake.set()

    def stop_polling(self) -> None:
        """Stop pulling upstream; resolutions and advances go on until :meth:`close`."""
        if self._polling:
            self._polling = False
            task = self._task
            if self._in_poll and task is not None and not task.done():
                self._stop_requested = True  # _guarded_poll absorbs this cancellation
                task.cancel()
            self._pump_wake.set()

    async def wait_closed(self) -> None:
        """Wait for the group's task to end (without cancelling it if the waiter is)."""
        task = self._task
        if task is not None:
            await asyncio.shield(task)

    async def abort(self) -> None:
        """Cancel the group's tasks (a producer stuck in advance or aclose) and wait."""
        self.close()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                async with asyncio.timeout(5.0):
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()  # aclose is stuck too: cancel it and give up on it
                log.warning("Shared stream group key=%r did not stop; abandoned", self.key)
            except (asyncio.CancelledError, Exception):
                pass
