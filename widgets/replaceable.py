"""A live view shown under a display id, so that its static form can take its place.

The monitor and the dashboard are ipywidgets while they update. When one stops (or its
communicator closes) the output it occupies is replaced, in place, by its static HTML form:
a stopped view never looks live, and an executed notebook (nbconvert, the docs site, GitHub)
keeps a picture rather than an empty widget box. Starting it again puts the live widget back.
"""

from __future__ import annotations

import abc
import uuid

from ..display import in_kernel

__all__ = ("ReplaceableView",)

_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class ReplaceableView(abc.ABC):
    """Mixin: :meth:`_ipython_display_` with a display id, :meth:`_show_static` and
    :meth:`_show_live` to swap the two forms. Subclasses say what each form is."""

    #: The output this view occupies once displayed through :meth:`_ipython_display_`.
    display_id: str | None = None
    _showing_static = False

    @abc.abstractmethod
    def static_bundle(self) -> dict[str, str]:
        """``text/plain`` and ``text/html``: the form shown where no widget manager runs."""

    @abc.abstractmethod
    def _live_bundle(self) -> dict:
        """The live widget's mimebundle (with the static form beside it, for frontends that
        cannot show a widget)."""

    #: stop() was called: displaying the view again does not restart it.
    _stopped = False

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

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """What a frontend shows now: in a kernel the live widget (plus its static form);
        elsewhere, or once stopped or closed (nothing live to show), the static form only."""
        if not self.running:
            self.update()
        if not in_kernel():
            return self.static_bundle()
        if not self._stopped:
            self.start()
        if not self.running:
            return self.static_bundle()
        return self._live_bundle()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        bundle = self._repr_mimebundle_()
        if _WIDGET_VIEW not in bundle:
            display(bundle, raw=True)
            return
        self.display_id = self.display_id or uuid.uuid4().hex
        self._showing_static = False
        display(bundle, raw=True, display_id=self.display_id)

    def _show_static(self) -> None:
        """Replace the displayed live widget by the static form (same output, same place)."""
        if self.display_id is None or self._showing_static or not in_kernel():
            return
        from IPython.display import update_display

        self._showing_static = True
        update_display(self.static_bundle(), raw=True, display_id=self.display_id)

    def _show_live(self) -> None:
        """Put the live widget back where the static form stands."""
        if self.display_id is None or not self._showing_static or not in_kernel():
            return
        from IPython.display import update_display

        self._showing_static = False
        update_display(self._live_bundle(), raw=True, display_id=self.display_id)
