"""A live view shown under a display id, so that its static form can take its place.

The monitor and the dashboard are ipywidgets while they update. When one is frozen (its
:meth:`~ReplaceableView.freeze`), stops, or what it shows closes, it keeps one picture for
good (every figure from one sample, dated) and the output it occupies is replaced, in place,
by its static HTML form: a stopped view never looks live, and an executed notebook
(nbconvert, the docs site, GitHub) keeps that picture rather than an empty widget box.
Starting it again puts the live widget back.
"""

from __future__ import annotations

import abc
import threading
import uuid
from typing import ClassVar, Self

import anywidget

from ..display.kernel import in_kernel

__all__ = ("LiveWidget", "ReplaceableView")

_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# What a parked widget's model holds instead of its ES module and stylesheet: a module that
# draws one line, should a frontend still render the model (a page reloaded from an old save).
PARKED_ESM = ('export default { render({ el }) { el.textContent = '
              '"netq: this view stopped; its static snapshot took its place."; } };')


class LiveWidget(anywidget.AnyWidget):
    """The anywidget behind a live view, which can be *parked* while its output shows the
    static form: its model then holds a one-line module, no stylesheet and empty data traits
    instead of the whole front end and its last figures. Nothing renders a parked model (its
    output was replaced), but notebook executors (nbclient) store the state of every model
    ever opened: parked, a stopped view leaves a few hundred bytes there, not tens of KiB.
    ``data_traits``: the synced traits a subclass fills on every update."""

    data_traits: ClassVar[tuple[str, ...]] = ()
    _parked: tuple[str, str, dict[str, object]] | None = None

    def park(self) -> None:
        """Swap the front end and the data out (idempotent)."""
        if self._parked is not None:
            return
        # anywidget adds _esm and _css as traits at run time (the files' text): set by name.
        self._parked = (str(getattr(self, "_esm")), str(getattr(self, "_css")),  # noqa: B009
                        {name: getattr(self, name) for name in self.data_traits})
        with self.hold_sync():
            setattr(self, "_esm", PARKED_ESM)  # noqa: B010
            setattr(self, "_css", "")  # noqa: B010
            for name in self.data_traits:
                setattr(self, name, {})

    def unpark(self) -> None:
        """Put the front end and the last data back (idempotent)."""
        if self._parked is None:
            return
        esm, css, data = self._parked
        with self.hold_sync():
            setattr(self, "_esm", esm)  # noqa: B010
            setattr(self, "_css", css)  # noqa: B010
            for name, value in data.items():
                if not getattr(self, name):  # not refilled by an update while parked
                    setattr(self, name, value)
        self._parked = None

    @property
    def parked(self) -> bool:
        return self._parked is not None


class ReplaceableView(abc.ABC):
    """Mixin: :meth:`_ipython_display_` with a display id, :meth:`_show_static` and
    :meth:`_show_live` to swap the two forms. Subclasses say what each form is."""

    #: The output this view occupies once displayed through :meth:`_ipython_display_`.
    display_id: str | None = None
    _showing_static = False

    #: stop() was called: displaying the view again does not restart it.
    _stopped = False
    #: The live widget (parked while the static form stands in its output).
    widget: LiveWidget
    #: Guards sampling against freezing (subclasses make it in ``__init__``).
    _lock: threading.Lock | threading.RLock
    #: Once frozen: the static form's badge word (``snapshot``, ``stopped``, ``closed``) ...
    _frozen_state: str | None = None
    #: ... and its bundle, drawn once from one sample.
    _frozen_bundle: dict[str, str]

    @abc.abstractmethod
    def _freeze_locked(self, state: str) -> None:
        """Keep one picture, with ``state`` as its badge (:meth:`_keep`); holds ``_lock``."""

    @abc.abstractmethod
    def _end_sampling(self) -> None:
        """Stop the sampling thread feeding this view (it may be the calling thread)."""

    @abc.abstractmethod
    def _current_bundle(self) -> dict[str, str]:
        """The static form of the newest sample (the view is not frozen); holds ``_lock``."""

    def _keep(self, state: str, bundle: dict[str, str]) -> None:
        """Freeze on ``bundle`` (text/plain and text/html of one sample)."""
        self._stopped = True
        self._frozen_state = state
        self._frozen_bundle = bundle

    def freeze(self) -> Self:
        """Stop sampling and keep the view exactly as it is now, live and in its static form
        (the ``text/html`` and ``text/plain`` a notebook stores): every figure from the last
        sample shown, with the sentence ``snapshot taken HH:MM:SS, not live (frozen)``. Later
        cells, :meth:`stop` and what it shows closing leave it as it is; ``start()`` makes it
        live again. Calling it again does nothing. Returns the view."""
        with self._lock:
            changed = self._frozen_state is None
            if changed:
                self._freeze_locked("snapshot")
        if changed:
            self._end_sampling()
            self._show_static()
        return self

    def stop(self) -> None:
        """Stop sampling (the thread ends within one interval) and show the static form: one
        last sample, frozen, its badge ``stopped``. A view already frozen stays as it is."""
        self._stopped = True
        self._end_sampling()
        self.update()
        with self._lock:
            if self._frozen_state is None:
                self._freeze_locked("stopped")
        self._show_static()

    @property
    def frozen(self) -> bool:
        """True once the view keeps one picture (:meth:`freeze`, :meth:`stop`, closed)."""
        return self._frozen_state is not None

    def _thaw(self) -> None:
        """Live again (``start()``): the kept picture goes."""
        with self._lock:
            self._stopped = False
            self._frozen_state = None
            self._frozen_bundle = {}

    def static_bundle(self) -> dict[str, str]:
        """``text/plain`` + ``text/html`` of one sample, drawn from one view document (the two
        agree: same badge word, same figures): nbconvert, a docs site, GitHub and any frontend
        without a widget manager show this. Once frozen, the same bundle every time."""
        with self._lock:
            if self._frozen_state is not None:
                return dict(self._frozen_bundle)
            return self._current_bundle()

    def static_html(self) -> str:
        """The static form (:meth:`static_bundle`'s ``text/html``): the figures of one sample,
        saying it is a snapshot and when it was taken; no script, never a live badge."""
        return self.static_bundle()["text/html"]

    def __repr__(self) -> str:
        if not self.running:
            self.update()
        return self.static_bundle()["text/plain"]

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """True while the view samples and updates."""

    @abc.abstractmethod
    def update(self) -> None:
        """Take one sample now and render it (any thread)."""

    @abc.abstractmethod
    def start(self) -> ReplaceableView:
        """Start sampling (idempotent) and show the live form."""

    def _live_bundle(self) -> tuple[dict, dict]:
        """The live widget's mimebundle with the static form beside it (for frontends that
        cannot show a widget), and its metadata (anywidget's, for Colab's widget manager)."""
        shown = self.widget._repr_mimebundle_()
        data, metadata = shown if isinstance(shown, tuple) else (shown or {}, {})
        bundle = dict(data)
        bundle.update(self.static_bundle())  # our text and static form, not the widget's repr
        return bundle, dict(metadata or {})

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict | tuple[dict, dict]:
        """What a frontend shows now: in a kernel the live widget (plus its static form, and
        metadata where the frontend needs some); elsewhere, or once stopped or closed (nothing
        live to show), the static form only."""
        if not self.running:
            self.update()
        if not in_kernel():
            return self.static_bundle()
        if not self._stopped:
            self.start()
        if not self.running:
            return self.static_bundle()
        bundle, metadata = self._live_bundle()
        return (bundle, metadata) if metadata else bundle

    def _ipython_display_(self) -> None:
        from IPython.display import display

        shown = self._repr_mimebundle_()
        bundle, metadata = shown if isinstance(shown, tuple) else (shown, {})
        extra = {"metadata": metadata} if metadata else {}
        if _WIDGET_VIEW not in bundle:
            display(bundle, raw=True)
            return
        self.display_id = self.display_id or uuid.uuid4().hex
        self._showing_static = False
        display(bundle, raw=True, display_id=self.display_id, **extra)

    def _show_static(self) -> None:
        """Replace the displayed live widget by the static form (same output, same place)."""
        if self.display_id is None or self._showing_static or not in_kernel():
            return
        from IPython.display import update_display

        self._showing_static = True
        update_display(self.static_bundle(), raw=True, display_id=self.display_id)
        self.widget.park()

    def _show_live(self) -> None:
        """Put the live widget back where the static form stands."""
        if self.display_id is None or not self._showing_static or not in_kernel():
            return
        from IPython.display import update_display

        self._showing_static = False
        self.widget.unpark()
        bundle, metadata = self._live_bundle()
        extra = {"metadata": metadata} if metadata else {}
        update_display(bundle, raw=True, display_id=self.display_id, **extra)
